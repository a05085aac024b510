"""Engines never run as root: real agents and supervisors, real sim engines, the kernel's own answers.

As root (make test here and in CI) each shard's engine runs as a uid of its own from engine_uids: its real
and effective uid, from /proc/PID/status, are not 0 and differ between shards, it has no supplementary
groups, and as that uid the agent's key, the state files and the other engine's environment (its API key)
cannot be opened. The preflight refuses a shard whose model its user cannot reach, naming the directory.
As another user the agent has nothing to switch to, and its engines run as that user.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from llmgw.agent.engines import sglang
from llmgw.agent.engines.sglang import Sglang
from llmgw.agent.supervisor import identity, launching, preflight
from llmgw.core.shards import ShardSpec, ShardState
from llmgw.testing import system as system_mod
from llmgw.testing.supervised import LeavingHarness, SupervisorHarness

S = ShardState
pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0


def ids_of(pid: int) -> dict[str, list[int]]:
    """Uid, Gid and Groups from /proc/PID/status: the kernel's view of who the process is."""
    found: dict[str, list[int]] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            found[key] = [int(v) for v in value.split()]
    return found


def open_as(uid: int, gid: int, path: Path | str) -> subprocess.CompletedProcess[str]:
    """``cat PATH`` as ``uid``/``gid`` with no supplementary groups, as the engine is."""
    return subprocess.run(["cat", str(path)], user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                          timeout=30, check=False)


def spec(shard_id: str, *, source: str = "", key: str = "k") -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine="sim", served_name="m",
                     api_key=key, source=source)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., SupervisorHarness]]:
    made: list[SupervisorHarness] = []

    def make(*, cls: type[SupervisorHarness] = SupervisorHarness, **kw: Any) -> SupervisorHarness:
        users = identity.Users(identity.resolve(identity.AUTO))
        made.append(cls(tmp_path / "state" / "shards", users=users, **kw))
        return made[-1]

    yield make
    for h in made:
        if getattr(h, "closed", False):
            continue
        try:
            h.run(h.sup.stop_all(reason="test over"))
            h.run(h.sup.close())
        finally:
            h.loop.close()
    for p in psutil.process_iter():
        try:
            if p.environ().get("LLMGW_RUN_DIR", "").startswith(str(tmp_path)):
                p.kill()
        except psutil.Error:
            continue


def test_each_shard_runs_as_a_uid_of_its_own_that_reads_no_other(harness: Callable[..., SupervisorHarness],
                                                                 tmp_path: Path) -> None:
    h = harness()
    h.run(h.sup.start(spec("a", key="key-of-a")))
    h.run(h.sup.start(spec("b", key="key-of-b")))
    a, b = h.wait_state("a", S.READY), h.wait_state("b", S.READY)
    ida, idb = ids_of(a.pid), ids_of(b.pid)
    if not ROOT:
        # Nothing to switch to: the agent's own user, and said so in the log.
        assert ida["Uid"][:2] == idb["Uid"][:2] == [os.getuid()] * 2
        return
    lo, hi = identity.DEFAULT_UIDS
    for ids in (ida, idb):
        assert ids["Uid"][0] == ids["Uid"][1] != 0 and lo <= ids["Uid"][0] <= hi, ids  # real and effective
        assert ids["Gid"][0] == ids["Gid"][1] == ids["Uid"][0] and ids["Groups"] == [], ids
    assert ida["Uid"][0] != idb["Uid"][0]
    uid_a = ida["Uid"][0]
    # As a: the other engine's environment (its API key), its work dir, and the agent's state file of it.
    run_dir = tmp_path / "state" / "shards"
    for path in (f"/proc/{b.pid}/environ", run_dir / "b.d", run_dir / "b.json", run_dir / "b.log"):
        got = open_as(uid_a, uid_a, path)
        assert got.returncode != 0 and "Permission denied" in got.stderr, (path, got)
    assert "key-of-b" in Path(f"/proc/{b.pid}/environ").read_text()  # root reads it: the key is there to hide
    # Its own environment and work dir it has: the engine is not crippled, only fenced.
    assert open_as(uid_a, uid_a, f"/proc/{a.pid}/environ").returncode == 0
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{a.pid}/environ").read_text().split("\0") if "=" in kv)
    assert env["HOME"] == str(run_dir / "a.d") and env["USER"] == env["LOGNAME"] == f"llmgw-shard-{uid_a}"
    assert (run_dir / "a.d").stat().st_uid == uid_a
    st = h.run(h.sup.stop("a"))
    assert st.state is S.STOPPED and not (run_dir / "a.d").exists()


def test_an_adopted_engine_keeps_its_uid_and_a_new_shard_gets_another(harness: Callable[..., SupervisorHarness],
                                                                       tmp_path: Path) -> None:
    first = harness(cls=LeavingHarness)
    first.run(first.sup.start(spec("a")))
    a = first.wait_state("a", S.READY)
    uid = ids_of(a.pid)["Uid"][0]
    first.die()  # type: ignore[attr-defined]
    second = harness()
    adopted = second.run(second.sup.recover())
    assert [s.shard_id for s in adopted] == ["a"] and adopted[0].pid == a.pid
    assert second.wait_state("a", S.READY).pid == a.pid and ids_of(a.pid)["Uid"][0] == uid
    second.run(second.sup.start(spec("b")))
    b = second.wait_state("b", S.READY)
    if ROOT:
        assert ids_of(b.pid)["Uid"][0] not in (0, uid)
    # The orphan sweep still knows engines of other uids by their marker: a stop ends the adopted one.
    assert second.run(second.sup.stop("a")).state is S.STOPPED and not psutil.pid_exists(a.pid)


def test_an_engine_left_without_a_state_file_is_found_under_its_uid_and_killed(
        harness: Callable[..., SupervisorHarness], tmp_path: Path) -> None:
    first = harness(cls=LeavingHarness)
    first.run(first.sup.start(spec("a")))
    a = first.wait_state("a", S.READY)
    first.die()  # type: ignore[attr-defined]
    (tmp_path / "state" / "shards" / "a.json").unlink()
    second = harness()
    assert second.run(second.sup.recover()) == []
    deadline = time.monotonic() + 10
    while _alive(a.pid):
        assert time.monotonic() < deadline, "the unidentifiable engine was not killed"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not; one gone between two looks does not either)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_model_its_user_cannot_reach_is_refused_before_launch(harness: Callable[..., SupervisorHarness],
                                                                 tmp_path: Path) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    os.chmod(hidden, 0o700)
    model = hidden / "model.gguf"
    model.write_bytes(b"GGUF")
    h = harness()
    st = h.run(h.sup.start(spec("a", source=f"file://{model}")))
    if not ROOT:
        return  # its own user reaches its own directory
    assert st.state is S.FAILED, st
    assert f"cannot read {model}: {hidden} is 0700 (owner root)" in st.message, st.message
    assert "engine_user" in st.message and not (tmp_path / "state" / "shards" / "a.d").exists()


def test_a_real_agent_as_root_runs_engines_that_cannot_open_its_key(tmp_path: Path) -> None:
    with system_mod.running(tmp_path) as s:
        s.apply(system_mod.sim_model("two", replicas=2))
        s.wait_model("two")
        pids = sorted(p for p in s.engine_pids() if _marked(p))
        assert len(pids) == 2, pids
        uids = [ids_of(p)["Uid"] for p in pids]
        if not ROOT:
            assert all(u[:2] == [os.getuid()] * 2 for u in uids), uids
            return
        assert all(u[0] != 0 and u[1] != 0 for u in uids) and uids[0][0] != uids[1][0], uids
        key = tmp_path / "node1" / "pki" / "node.key"
        assert key.exists()
        for u in uids:
            got = open_as(u[0], u[0], key)
            assert got.returncode != 0 and "Permission denied" in got.stderr, got
        # The other engine's key, in its environment.
        got = open_as(uids[0][0], uids[0][0], f"/proc/{pids[1]}/environ")
        assert got.returncode != 0 and "Permission denied" in got.stderr, got
        assert "a uid of their own per shard" in (tmp_path / "agent-node1.log").read_text()


def _marked(pid: int) -> bool:
    try:
        return "LLMGW_SHARD_ID" in psutil.Process(pid).environ()
    except psutil.Error:
        return False


def test_the_interpreter_the_tests_run_with_is_one_engines_can_run() -> None:
    """The Makefile's venv: made from a Python every user can run, or no engine starts (the trap of /root)."""
    assert preflight.blocked(sys.executable, 65534, 65534, run=True) is None


def test_a_named_user_runs_every_engine_and_keeps_none_of_the_agents_groups(tmp_path: Path) -> None:
    users = identity.Users(identity.resolve("nobody"))
    h = SupervisorHarness(tmp_path / "named" / "shards", users=users)
    try:
        h.run(h.sup.start(spec("a")))
        ids = ids_of(h.wait_state("a", S.READY).pid)
        nobody = pwd.getpwnam("nobody")
        want = [nobody.pw_uid, nobody.pw_gid] if ROOT else [os.getuid(), os.getgid()]
        assert [ids["Uid"][1], ids["Gid"][1]] == want, ids
        assert 0 not in ids["Groups"] or not ROOT, ids
    finally:
        h.run(h.sup.stop_all(reason="test over"))
        h.run(h.sup.close())
        h.loop.close()


def test_a_key_file_the_adapter_writes_is_the_engines_alone(tmp_path: Path) -> None:
    """SGLang takes its key only in a file: written 0600 in the work dir, and then given to the engine's uid."""
    run_dir = tmp_path / "shards"
    model = tmp_path / "model"
    model.mkdir()
    uid = 600123 if ROOT else os.getuid()
    user = identity.EngineUser(uid, uid, f"llmgw-shard-{uid}")
    shard = ShardSpec(shard_id="s1", replica_id="r", model="m", engine="sglang", served_name="m", api_key="sk-s1",
                      source=str(model))
    p = launching.plan(shard, Sglang(python=sys.executable), host="127.0.0.1", model_path=str(model), cpu_count=2,
                       run_dir=run_dir, user=user)
    key = run_dir / "s1.d" / sglang.CONFIG_FILE
    assert p.work_dir == run_dir / "s1.d" and p.user == user and p.cwd == p.work_dir
    assert (key.stat().st_uid, key.stat().st_mode & 0o777) == (uid, 0o600)
    assert (p.work_dir.stat().st_uid, p.work_dir.stat().st_mode & 0o777) == (uid, 0o700)
    assert p.env["HOME"] == str(p.work_dir) and p.env["USER"] == p.env["LOGNAME"] == f"llmgw-shard-{uid}"
    if ROOT:
        assert "sk-s1" in open_as(uid, uid, key).stdout
        other = open_as(uid + 1, uid + 1, key)
        assert other.returncode != 0 and "Permission denied" in other.stderr, other
        assert (run_dir.stat().st_mode & 0o777) == 0o711  # made by llmgw: searchable, not listable
    launching.remove_work_dir(p.work_dir)
