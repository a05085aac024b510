"""The launch plan as data: the shard's private work dir, the node's facts handed to the adapter, whether the
process serves HTTP, the collectives' variables that win, and what a state file keeps of it all."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import engines
from llmgw.agent.supervisor import launching, orphans, recovering, statefiles
from llmgw.core import enginecheck, inventory
from llmgw.core.errors import EngineError
from llmgw.core.shards import ShardSpec

SPEC = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", port=8011)
FACTS = enginecheck.NodeFacts(gpus=(inventory.Gpu(0, "GPU-0", "test", 0, 0),), mgmt_interface="ens7")


class Recording:
    """An adapter that records what it was given; ``env`` and ``serves_http`` say what it answers."""

    name, health_path = "sim", "/health"

    def __init__(self, *, env: dict[str, str] | None = None, serves_http: bool = True,
                 refuse: str = "", cwd: str | None = None) -> None:
        self.env, self.serves_http, self.refuse, self.cwd = env or {}, serves_http, refuse, cwd
        self.given: dict[str, Any] = {}

    def launch(self, spec: ShardSpec, **kw: Any) -> engines.Launch:
        self.given = kw
        # What the adapter sees: the dir exists already, for a file it must write (SGLang's key).
        self.given["dir_existed"] = Path(kw["work_dir"]).is_dir()
        if self.refuse:
            raise EngineError(self.refuse)
        return engines.Launch(argv=[sys.executable, "-c", "import os; print(os.getcwd())"], env=self.env,
                              serves_http=self.serves_http, cwd=self.cwd or "")


def plan(tmp_path: Path, adapter: Recording, spec: ShardSpec = SPEC, **kw: Any) -> launching.Plan:
    return launching.plan(spec, adapter, host="127.0.0.1", model_path=None, cpu_count=2, run_dir=tmp_path, **kw)


def test_plan_makes_a_private_work_dir_and_hands_the_adapter_it_and_the_nodes_facts(tmp_path: Path) -> None:
    """<run_dir>/<id>.d, mode 0700, exists when the adapter runs; the facts given are the node's own."""
    adapter = Recording(serves_http=False)
    p = plan(tmp_path, adapter, node=FACTS)
    assert p.work_dir == tmp_path / "s1.d" and adapter.given["work_dir"] == str(tmp_path / "s1.d")
    assert adapter.given["dir_existed"] and stat.S_IMODE(p.work_dir.stat().st_mode) == 0o700
    assert adapter.given["node"] is FACTS and p.serves_http is False
    # Facts not known yet: the adapter gets empty ones, never None.
    unknown = Recording()
    assert plan(tmp_path, unknown).serves_http is True and unknown.given["node"] == enginecheck.NodeFacts()


def test_a_refusal_leaves_no_work_dir(tmp_path: Path) -> None:
    """The adapter refusing, or a rank that cannot meet its leader, removes the dir the plan made."""
    with pytest.raises(EngineError, match="no such flag"):
        plan(tmp_path, Recording(refuse="no such flag"))
    bad_rank = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", port=8011,
                         nnodes=2, rank=5, leader_addr="h", leader_port=1)
    with pytest.raises(EngineError, match="rank 5 is not one of the 2 ranks"):
        plan(tmp_path, Recording(), bad_rank)
    assert list(tmp_path.iterdir()) == []


def test_a_leftover_work_dir_is_replaced_and_a_symlink_is_refused(tmp_path: Path) -> None:
    """An earlier engine's sockets go; a link at the path is not llmgw's, and what it points at is kept."""
    old = tmp_path / "s1.d"
    (old / "rpc").mkdir(parents=True)
    (old / "rpc" / "socket").write_text("stale")
    assert list(plan(tmp_path, Recording()).work_dir.iterdir()) == []  # type: ignore[union-attr]
    launching.remove_work_dir(old)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep").write_text("x")
    old.symlink_to(precious)
    with pytest.raises(EngineError, match=r"s1\.d exists and is not a directory llmgw made; remove it"):
        plan(tmp_path, Recording())
    launching.remove_work_dir(old)  # never through the link
    assert (precious / "keep").read_text() == "x" and old.is_symlink()
    with pytest.raises(ValueError, match="not a shard's work dir"):
        launching.remove_work_dir(precious)
    assert (precious / "keep").exists()


def test_the_adapters_collective_variables_win_over_the_specs_and_the_agents(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the adapter derives wins; a value it only passed on from the spec is the spec's; HCAs fall back."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "docker0")  # the agent's own
    rank = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", port=8011,
                     nnodes=2, rank=1, leader_addr="h", leader_port=1, hcas=("mlx5_1",),
                     env=(("NCCL_SOCKET_IFNAME", "eth0"), ("NCCL_IB_GID_INDEX", "0"), ("NCCL_DEBUG", "INFO")))
    derived = {"NCCL_SOCKET_IFNAME": "ens7", "GLOO_SOCKET_IFNAME": "ens7", "NCCL_IB_GID_INDEX": "0"}
    p = plan(tmp_path, Recording(env={**dict(rank.env), **derived}), rank, node=FACTS)
    got = {k: p.env.get(k) for k in (*launching.FABRIC_ENV, "NCCL_DEBUG")}
    assert got == {"NCCL_SOCKET_IFNAME": "ens7", "GLOO_SOCKET_IFNAME": "ens7", "NCCL_IB_HCA": "mlx5_1",
                   "NCCL_IB_GID_INDEX": "0", "NCCL_DEBUG": "INFO"}
    # An adapter's own NCCL_IB_HCA (a port suffix, say) is not replaced by the plain list.
    p = plan(tmp_path, Recording(env={"NCCL_IB_HCA": "=mlx5_1:1"}), rank, node=FACTS)
    assert p.env["NCCL_IB_HCA"] == "=mlx5_1:1"


def _saved(**kw: Any) -> statefiles.Saved:
    return statefiles.Saved(spec=SPEC, pid=4242, create_time=1.0, port=8011, endpoint="http://127.0.0.1:8011",
                            host="127.0.0.1", log_path=Path("/x/s1.log"), **kw)


def test_a_state_file_keeps_whether_the_engine_serves_http(tmp_path: Path) -> None:
    """A worker rank's file says so; an older agent's file (no field) means it serves; a non-bool is unreadable."""
    path = statefiles.write(tmp_path, _saved(serves_http=False))
    assert statefiles.read(path).serves_http is False
    raw = json.loads(path.read_text())
    del raw["serves_http"]
    path.write_text(json.dumps(raw))
    assert statefiles.read(path).serves_http is True
    raw["serves_http"] = "no"
    path.write_text(json.dumps(raw))
    with pytest.raises(statefiles.Unreadable, match="serves_http is 'no'"):
        statefiles.read(path)


def _seen(pid: int, shard_id: str | None) -> orphans.Seen:
    return orphans.Seen(pid=pid, create_time=1.0, pgid=pid, shard_id=shard_id, run_dir="/run", environ_read=True)


def test_recovery_removes_the_work_dirs_of_the_dead_and_the_killed_only(tmp_path: Path) -> None:
    """Forgotten and killed shards' dirs, once each; an adopted shard's (and its workers') stay; odd names none."""
    decisions: list[recovering.Decision] = [
        recovering.Forget(tmp_path / "dead.json", "gone"),
        recovering.Forget(tmp_path / "..json", "a name put there by hand"),
        recovering.Kill(_seen(11, "lost"), "no state file"),
        recovering.Kill(_seen(12, "lost"), "no state file"),
        recovering.Kill(_seen(13, None), "no shard id"),
        recovering.Adopt(_saved(), _seen(4242, "s1")),
        recovering.Kill(_seen(14, "s1"), "cannot happen: decide keeps an adopted shard's workers"),
    ]
    assert recovering.ended_work_dirs(decisions, run_dir=tmp_path) == [tmp_path / "dead.d", tmp_path / "lost.d"]


def test_an_engine_runs_in_its_work_dir_when_its_adapter_asks_and_nowhere_else(tmp_path: Path) -> None:
    """Launch.cwd = the work dir: the process starts there (vLLM names its sockets from it); elsewhere is refused."""
    p = plan(tmp_path, Recording(cwd=str(tmp_path / "s1.d")))
    assert p.cwd == tmp_path / "s1.d"

    async def run() -> None:
        proc, _ = await launching.spawn(p)
        await proc.wait()
    asyncio.run(run())
    assert p.log_path.read_text().strip() == str(tmp_path / "s1.d")
    assert plan(tmp_path, Recording()).cwd is None  # "" asks for the agent's own
    with pytest.raises(EngineError, match="not its work dir"):
        plan(tmp_path, Recording(cwd="/etc"))
    assert not (tmp_path / "s1.d").exists()  # the refusal removed the dir it made
