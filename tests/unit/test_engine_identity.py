"""Who engines run as, on plain data: the uid range, the choice of a uid, the setting's meaning, the path walk."""

from __future__ import annotations

import dataclasses
import os
import pwd
from pathlib import Path

import pytest

from llmgw.agent import settings, settingsload
from llmgw.agent.supervisor import identity, preflight
from llmgw.core.errors import EngineError, LlmgwError


def _pw(name: str, uid: int, gid: int) -> pwd.struct_passwd:
    return pwd.struct_passwd((name, "x", uid, gid, "", "/nonexistent", "/usr/sbin/nologin"))


def _getpwnam(users: dict[str, tuple[int, int]]):  # type: ignore[no-untyped-def]
    def get(name: str) -> pwd.struct_passwd:
        if name not in users:
            raise KeyError(name)
        return _pw(name, *users[name])
    return get


def test_uid_ranges_are_read_and_uid_0_is_never_in_one() -> None:
    assert identity.parse_uids("600000-609999") == (600000, 609999)
    assert identity.parse_uids(" 7-7 ") == (7, 7)
    for bad in ("0-10", "10-5", "600000", "a-b", "-5-10", "1-4294967295"):
        with pytest.raises(ValueError, match="uid"):
            identity.parse_uids(bad)


def test_a_uid_is_one_no_live_shard_has_and_the_shard_id_chooses_where_to_start() -> None:
    first = identity.pick_uid(10, 19, set(), "shard-a")
    assert first is not None and 10 <= first <= 19
    assert identity.pick_uid(10, 19, set(), "shard-a") == first  # the same id, the same place
    taken = {first}
    second = identity.pick_uid(10, 19, taken, "shard-a")
    assert second not in taken and second == (first - 10 + 1) % 10 + 10  # the next free one, wrapping
    assert identity.pick_uid(10, 19, set(range(10, 20)) - {13}, "anything") == 13
    assert identity.pick_uid(10, 19, set(range(10, 20)), "full") is None
    spread = {identity.pick_uid(600000, 609999, set(), f"m-{i}") for i in range(50)}
    assert len(spread) > 40  # shards spread over the range: a freed uid is rarely the next one given


def test_users_give_live_shards_distinct_uids_and_free_those_of_ended_ones() -> None:
    running = {600000 + i for i in range(0, 10_000, 2)}  # half the range belongs to processes already
    users = identity.Users(identity.Policy("range"), running=lambda: set(running))
    got = {}
    for i in range(200):
        sid = f"s{i}"
        user = users.take(sid, live=set(got) | {sid})
        assert user is not None and user.uid == user.gid and user.name == f"llmgw-shard-{user.uid}"
        assert user.uid not in running and user.uid != 0
        got[sid] = user.uid
    assert len(set(got.values())) == 200
    # s0 ended: its uid may be given again; s1 lives: its uid is never given while it does.
    again = {users.take(f"n{i}", live=set(got) - {"s0"} | {f"n{i}"}).uid for i in range(50)}  # type: ignore[union-attr]
    assert got["s1"] not in again


def test_every_uid_in_use_refuses_the_shard_saying_what_to_widen() -> None:
    users = identity.Users(identity.Policy("range", uids=(5, 6)), running=set)
    assert users.take("a", live={"a"}) is not None and users.take("b", live={"a", "b"}) is not None
    with pytest.raises(EngineError, match="every uid of engine_uids 5-6 is in use.*widen engine_uids"):
        users.take("c", live={"a", "b", "c"})


def test_an_adopted_shard_keeps_its_uid_and_no_new_shard_gets_it() -> None:
    users = identity.Users(identity.Policy("range", uids=(5, 6)), running=set)
    kept = users.keep("old", 5, 5)
    assert kept == identity.EngineUser(5, 5, "llmgw-shard-5")
    assert users.take("new", live={"old", "new"}) == identity.EngineUser(6, 6, "llmgw-shard-6")
    assert users.keep("older", None, None) is None  # an older agent's file: its own user


def test_the_setting_resolves_per_user_and_never_to_root() -> None:
    names = _getpwnam({"llm": (990, 990), "toor": (0, 0), "wheel": (991, 0)})
    assert identity.resolve("auto", euid=0, getpwnam=names) == identity.Policy("range")
    assert identity.resolve("auto", (7, 9), euid=0, getpwnam=names).uids == (7, 9)
    assert identity.resolve("llm", euid=0, getpwnam=names) == identity.Policy(
        "user", user=identity.EngineUser(990, 990, "llm"))
    for setting in ("auto", "agent", "llm"):
        assert identity.resolve(setting, euid=1000, getpwnam=names) is identity.OWN  # nothing to switch to
    with pytest.raises(LlmgwError, match="engines never run as root"):
        identity.resolve("agent", euid=0, getpwnam=names)
    for root in ("toor", "wheel"):
        with pytest.raises(LlmgwError, match="never run as root or group root"):
            identity.resolve(root, euid=0, getpwnam=names)
    with pytest.raises(LlmgwError, match="no such user.*useradd"):
        identity.resolve("nobody-here", euid=0, getpwnam=names)
    with pytest.raises(LlmgwError, match="includes uid 0"):
        identity.resolve("auto", (0, 5), euid=0, getpwnam=names)


def test_which_uids_may_be_engines() -> None:
    ranged = identity.Policy("range", uids=(10, 19))
    assert [u for u in (0, 9, 10, 19, 20, 500) if ranged.may_be_engine(u, 500)] == [10, 19, 500]
    named = identity.Policy("user", user=identity.EngineUser(42, 42, "llm"))
    assert [u for u in (0, 41, 42, 500) if named.may_be_engine(u, 500)] == [42, 500]


def test_settings_read_engine_user_and_engine_uids() -> None:
    env = {"LLMGW_AGENT_SERVER": "cp"}
    st = settingsload.load(path=None, env=env, flags={})
    assert (st.engine_user, st.engine_uids) == ("auto", identity.DEFAULT_UIDS)
    st = settingsload.load(path=None, env={**env, "LLMGW_AGENT_ENGINE_USER": "llm",
                                       "LLMGW_AGENT_ENGINE_UIDS": "700000-700099"}, flags={})
    assert (st.engine_user, st.engine_uids) == ("llm", (700000, 700099))
    with pytest.raises(settings.SettingsError, match="LLMGW_AGENT_ENGINE_UIDS: .*uid 0 is root"):
        settingsload.load(path=None, env={**env, "LLMGW_AGENT_ENGINE_UIDS": "0-99"}, flags={})
    with pytest.raises(settings.SettingsError, match="LLMGW_AGENT_ENGINE_USER: expected auto, agent or a user"):
        settingsload.load(path=None, env={**env, "LLMGW_AGENT_ENGINE_USER": "two words"}, flags={})


def _tree(tmp_path: Path) -> Path:
    top = tmp_path / "top"
    (top / "open" / "model").mkdir(parents=True)
    (top / "open" / "model" / "w.bin").write_bytes(b"w")
    (top / "shut").mkdir(mode=0o700)
    (top / "shut" / "x").write_bytes(b"x")
    for d in (tmp_path, top, top / "open", top / "open" / "model"):
        d.chmod(0o755)
    (top / "shut").chmod(0o700)
    (top / "open" / "model" / "w.bin").chmod(0o644)
    (top / "shut" / "x").chmod(0o644)
    return top


def test_the_walk_names_the_directory_that_blocks(tmp_path: Path) -> None:
    top = _tree(tmp_path)
    other = 4242 if os.getuid() != 4242 else 4243
    assert preflight.blocked(str(top / "open" / "model"), other, other) is None
    assert preflight.blocked(str(top / "shut" / "x"), other, other) == f"{top / 'shut'} is 0700 (owner " \
        f"{pwd.getpwuid(os.getuid()).pw_name})"
    assert preflight.blocked(str(top / "absent"), other, other) is None  # missing: the launch says so itself
    # Its owner passes where others do not; a file in a model directory it cannot read is named.
    assert preflight.blocked(str(top / "shut" / "x"), os.getuid(), os.getgid()) is None
    (top / "open" / "model" / "w.bin").chmod(0o600)
    assert preflight.blocked(str(top / "open" / "model"), other, other) == (
        f"{top / 'open' / 'model' / 'w.bin'} is 0600 (owner {pwd.getpwuid(os.getuid()).pw_name})")
    # Running needs x on the file; reading does not.
    assert preflight.blocked(str(top / "shut"), os.getuid(), os.getgid(), run=True) is None
    assert "w.bin is 0600" in str(preflight.blocked(str(top / "open" / "model" / "w.bin"), other, other, run=True))


def test_the_walk_follows_symlinks_through_both_directories(tmp_path: Path) -> None:
    top = _tree(tmp_path)
    other = 4242 if os.getuid() != 4242 else 4243
    (top / "open" / "link").symlink_to(top / "shut" / "x")
    (top / "open" / "rel").symlink_to("model/w.bin")
    assert preflight.blocked(str(top / "open" / "link"), other, other) == (
        f"{top / 'shut'} is 0700 (owner {pwd.getpwuid(os.getuid()).pw_name})")
    assert preflight.blocked(str(top / "open" / "rel"), other, other) is None


def test_the_paths_an_engine_must_reach(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    argv = ["python3", "-m", "llmgw.testing.sim", "--model", "x", f"--config={model}", "/not/there"]
    found = preflight.paths_of(argv, str(model), {"PATH": "/usr/bin:/bin"})
    import llmgw

    assert found == [("/usr/bin/python3", True), (str(model), False),
                     (os.path.dirname(os.path.abspath(llmgw.__file__)), False)]


def test_the_preflight_says_what_blocks_and_what_to_do(tmp_path: Path) -> None:
    top = _tree(tmp_path)
    user = identity.EngineUser(4242, 4242, "llmgw-shard-4242")
    with pytest.raises(EngineError) as got:
        preflight.preflight(user, ["/bin/true"], model_path=str(top / "shut" / "x"), env={}, shard_id="s1")
    assert str(got.value).startswith(f"shard s1: its engine runs as uid 4242 (engine_user), which cannot read "
                                     f"{top / 'shut' / 'x'}: {top / 'shut'} is 0700")
    assert "outside /root" in str(got.value) and "set engine_user" in str(got.value)
    preflight.preflight(user, ["/bin/true"], model_path=str(top / "open" / "model"), env={}, shard_id="s1")


def test_an_engine_is_switched_by_the_asuser_script_with_none_of_the_agents_groups() -> None:
    """The engine's argv goes behind asuser.py with its uid, gid and only its own groups; no user: as it is."""
    import sys

    from llmgw.agent.supervisor import asuser, launching

    got = launching._switched(identity.EngineUser(7, 7, "llmgw-shard-7"), ["/bin/engine", "--flag"])
    assert got == [sys.executable, "-I", "-S", asuser.__file__, "7", "7", "", "--", "/bin/engine", "--flag"]
    assert launching._switched(identity.EngineUser(8, 8, "llm", groups=(44, 45)), ["e"])[6] == "44,45"
    assert launching._switched(None, ["e", "x"]) == ["e", "x"]


def test_the_asuser_script_refuses_root_and_runs_the_engine_as_the_user(tmp_path: Path) -> None:
    """Run for real (the tests run as root): uid 0 is refused; uid 600123 runs `id` with no groups, same pid."""
    import subprocess
    import sys

    from llmgw.agent.supervisor import asuser

    base = [sys.executable, "-I", "-S", asuser.__file__]
    refused = subprocess.run([*base, "0", "0", "", "--", "/usr/bin/id"], capture_output=True, text=True)
    assert refused.returncode != 0 and "refusing to run an engine as root" in refused.stderr
    ran = subprocess.run([*base, "600123", "600123", "", "--", "/usr/bin/id"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert "uid=600123" in ran.stdout and "gid=600123" in ran.stdout and "groups=600123" in ran.stdout
    missing = subprocess.run([*base, "600123", "600123", "", "--", str(tmp_path / "nope")], capture_output=True,
                             text=True)
    assert missing.returncode == 127 and "cannot start" in missing.stderr


def test_the_gpus_device_files_must_open_for_the_engines_user(tmp_path: Path) -> None:
    for name, mode in (("nvidiactl", 0o666), ("nvidia-uvm", 0o666), ("nvidia0", 0o666), ("nvidia1", 0o660)):
        (tmp_path / name).write_bytes(b"")
        (tmp_path / name).chmod(mode)
    gid = (tmp_path / "nvidia1").stat().st_gid
    user = identity.EngineUser(4242, 4242, "llmgw-shard-4242")
    why = preflight.gpu_blocked(user, dev=tmp_path)
    assert why is not None and why.startswith(f"{tmp_path / 'nvidia1'} is 0660 (owner ")
    assert preflight.gpu_blocked(identity.EngineUser(4242, 4242, "llm", groups=(gid,)), dev=tmp_path) is None
    (tmp_path / "nvidia1").chmod(0o666)
    assert preflight.gpu_blocked(user, dev=tmp_path) is None
    assert preflight.gpu_blocked(user, dev=tmp_path / "none") is None  # no GPUs: nothing to open


def test_a_named_user_keeps_its_own_groups_but_never_group_0() -> None:
    names = _getpwnam({"llm": (990, 990)})
    policy = identity.resolve("llm", euid=0, getpwnam=names, getgrouplist=lambda name, gid: [gid, 0, 44])
    assert policy.user == identity.EngineUser(990, 990, "llm", groups=(44,))


def test_an_agent_that_switches_users_leaves_what_it_writes_readable_whatever_its_umask() -> None:
    """Weights it fetches and engines it installs are read by the engines' users; only write bits stay masked."""
    from llmgw.agent import main
    from llmgw.agent.config import AgentConfig

    cfg = AgentConfig(servers=("127.0.0.1:1",), node_id="n1", mgmt_addr="127.0.0.1", state_dir=Path("/nonexistent"),
                      engine_users=identity.Policy("range"))
    before = os.umask(0o077)
    try:
        assert main.engine_users(cfg).policy == identity.Policy("range")
        assert os.umask(0o077) == 0o022
        main.engine_users(dataclasses.replace(cfg, engine_users=identity.OWN))  # nothing switched: left alone
        assert os.umask(before) == 0o077
    finally:
        os.umask(before)


def test_the_state_file_keeps_the_engines_uid_for_the_next_agent(tmp_path: Path) -> None:
    import json

    from llmgw.agent.supervisor import statefiles
    from llmgw.core.shards import ShardSpec

    saved = statefiles.Saved(spec=ShardSpec(shard_id="s1", replica_id="r", model="m", engine="sim", served_name="m"),
                             pid=4321, create_time=1.0, port=1, endpoint="http://127.0.0.1:1", host="127.0.0.1",
                             log_path=tmp_path / "s1.log", uid=600123, gid=600123)
    path = statefiles.write(tmp_path, saved)
    assert statefiles.read(path) == saved
    doc = json.loads(path.read_text())
    del doc["uid"], doc["gid"]  # an older agent's file: its engine ran as the agent's own user
    path.write_text(json.dumps(doc))
    assert (statefiles.read(path).uid, statefiles.read(path).gid) == (None, None)
    users = identity.Users(identity.Policy("range", uids=(600123, 600124)), running=set)
    assert users.keep("s1", saved.uid, saved.gid) == identity.EngineUser(600123, 600123, "llmgw-shard-600123")
    assert users.take("s2", live={"s1", "s2"}).uid == 600124  # type: ignore[union-attr]
    doc["uid"] = "root"
    path.write_text(json.dumps(doc))
    with pytest.raises(statefiles.Unreadable, match="uid or gid is 'root'"):
        statefiles.read(path)
