"""A rank of a multi-node replica: its fields cross the wire, become its engine's env and the sim's flags."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmgw.agent import engines
from llmgw.agent.supervisor import launching
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import enginecheck, inventory
from llmgw.core.errors import EngineError
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus
from llmgw.sim import engine as sim_engine

RANK1 = ShardSpec(shard_id="r1-1-1", replica_id="r1", model="m", engine="sim", served_name="m", port=8011,
                  gpus=(0, 1), nnodes=2, rank=1, leader_addr="10.0.0.1", leader_port=29500,
                  hcas=("mlx5_0", "mlx5_1"), tensor_parallel=4)


def test_rank_fields_round_trip() -> None:
    """StartShard and a status's spec carry nnodes, rank, leader and adapters; an older sender's means one node."""
    wire = pb.ShardSpec.FromString(convert.spec_to_pb(RANK1).SerializeToString())
    assert (wire.nnodes, wire.rank, wire.leader_addr, wire.leader_port, list(wire.hcas)) == (
        2, 1, "10.0.0.1", 29500, ["mlx5_0", "mlx5_1"])
    assert convert.spec_from_pb(wire) == RANK1
    status = ShardStatus("r1-1-1", "r1", ShardState.READY, spec=RANK1)
    assert convert.status_from_pb(pb.ShardStatus.FromString(convert.status_to_pb(status).SerializeToString())) == status
    old = convert.spec_from_pb(pb.ShardSpec(shard_id="old"))
    assert (old.nnodes, old.rank, old.hcas) == (1, 0, ())


def test_a_rank_gets_its_rank_env_over_the_specs_and_the_agents(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """LLMGW_RANK & co. come from the rank fields; an NCCL_IB_HCA from the agent or the spec does not win."""
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_9")  # the agent's own: adapters of another fabric
    spec = dataclasses.replace(RANK1, env=(("NCCL_IB_HCA", "mlx5_7"), ("NCCL_DEBUG", "INFO")))
    node = enginecheck.NodeFacts(gpus=tuple(inventory.Gpu(i, f"GPU-{i}", "test", 0, 0) for i in (0, 1)))
    p = launching.plan(spec, engines.get("sim"), host="127.0.0.1", model_path=None, cpu_count=2, run_dir=tmp_path,
                       node=node)
    got = {k: p.env[k] for k in ("LLMGW_NNODES", "LLMGW_RANK", "LLMGW_LEADER_ADDR", "LLMGW_LEADER_PORT",
                                 "NCCL_IB_HCA", "NCCL_DEBUG", "CUDA_VISIBLE_DEVICES")}
    assert got == {"LLMGW_NNODES": "2", "LLMGW_RANK": "1", "LLMGW_LEADER_ADDR": "10.0.0.1",
                   "LLMGW_LEADER_PORT": "29500", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "INFO",
                   "CUDA_VISIBLE_DEVICES": "0,1"}
    assert p.argv[-8:] == ["--nnodes", "2", "--rank", "1", "--leader-addr", "10.0.0.1", "--leader-port", "29500"]
    one = launching.plan(dataclasses.replace(RANK1, nnodes=1, rank=0, leader_addr="", leader_port=0, hcas=(),
                                             tensor_parallel=2),
                         engines.get("sim"), host="127.0.0.1", model_path=None, cpu_count=2, run_dir=tmp_path)
    # One node: nothing is added, and the agent's own NCCL_IB_HCA is left as it is.
    assert "LLMGW_RANK" not in one.env and one.env["NCCL_IB_HCA"] == "mlx5_9" and "--rank" not in one.argv


def test_a_rank_without_its_leader_is_refused_before_launch(tmp_path: Path) -> None:
    """A rank out of range, or no leader to meet, would hang in rendezvous: refused, saying so."""
    sim = engines.get("sim")
    with pytest.raises(EngineError, match="rank 2 is not one of the 2 ranks 0..1"):
        launching.plan(dataclasses.replace(RANK1, rank=2), sim, host="127.0.0.1", model_path=None, cpu_count=2,
                       run_dir=tmp_path)
    with pytest.raises(EngineError, match="has no leader address and port"):
        launching.plan(dataclasses.replace(RANK1, leader_addr=""), sim, host="127.0.0.1", model_path=None,
                       cpu_count=2, run_dir=tmp_path)


def test_the_sim_takes_its_rank_and_refuses_a_bad_one() -> None:
    args = sim_engine.parse_args(["--model", "m", "--nnodes", "3", "--rank", "2", "--leader-addr", "h",
                                  "--leader-port", "29501"])
    assert (args.nnodes, args.rank, args.leader_addr, args.leader_port) == (3, 2, "h", 29501)
    with pytest.raises(SystemExit):
        sim_engine.parse_args(["--model", "m", "--nnodes", "2", "--rank", "2"])
