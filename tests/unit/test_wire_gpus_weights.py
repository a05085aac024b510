"""GPU indices and weights metadata cross the wire both ways; the agent's GPU environment is decided before launch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmgw.agent import engines
from llmgw.agent.supervisor import launching
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import enginecheck
from llmgw.core import inventory as inv
from llmgw.core.errors import EngineError
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

SPEC = ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", port=8011,
                 gpus=(3, 1, 2))
WEIGHT = inv.WeightFile("/m/smol.gguf", 98_362_432, "gguf", params=134_515_008, layers=30, heads=9, kv_heads=3,
                        head_dim=64, hidden_size=576, context_length=8192, dtype_bytes=0)



def with_gpus(*indices: int) -> enginecheck.NodeFacts:
    return enginecheck.NodeFacts(gpus=tuple(inv.Gpu(i, f"GPU-{i}", "test", 0, 0) for i in indices))

def test_shard_gpus_round_trip_in_order() -> None:
    """A StartShard's gpus, and a status's spec, come back as sent (order is the CUDA numbering)."""
    msg = convert.spec_to_pb(SPEC)
    assert list(msg.gpus) == [3, 1, 2]
    wire = pb.ShardSpec.FromString(msg.SerializeToString())
    assert convert.spec_from_pb(wire) == SPEC
    status = ShardStatus("s1", "r1", ShardState.READY, spec=SPEC)
    assert convert.status_from_pb(pb.ShardStatus.FromString(convert.status_to_pb(status).SerializeToString())) == status
    assert convert.spec_from_pb(pb.ShardSpec(shard_id="old")).gpus == ()  # an older control plane: none


def test_weights_metadata_round_trips_in_register_and_heartbeat() -> None:
    """Every WeightFile field survives Register and a weights-changed heartbeat; an old agent's reads as unknown."""
    i = inv.Inventory(cpu_count=2, memory_total_bytes=1, memory_available_bytes=1, weights=(WEIGHT,))
    reg = pb.Register.FromString(pb.Register(node_id="n", **convert.register_fields(i)).SerializeToString())
    assert convert.inventory_from_register(reg).weights == (WEIGHT,)
    hb = inv.Heartbeat(memory_total_bytes=1, memory_available_bytes=1, weights=(WEIGHT,))
    back = convert.heartbeat_from_pb(pb.Heartbeat.FromString(convert.heartbeat_to_pb(hb).SerializeToString()))
    assert back.weights == (WEIGHT,)
    old = pb.WeightFile(path="/m/a.gguf", size_bytes=5, format="gguf")
    assert convert.weights_from_pb([old]) == (inv.WeightFile("/m/a.gguf", 5, "gguf"),)
    # The stored inventory (asdict, then back) keeps them too.
    assert inv.inventory_from_dict(dataclasses.asdict(i)).weights == (WEIGHT,)


def test_gpu_env_is_the_spec_gpus_or_an_empty_list_on_a_gpu_node() -> None:
    """Given GPUs: exactly them, in PCI (NVML) order. None on a GPU node: hidden. CPU node or unknown: nothing."""
    assert launching.gpu_env(SPEC, (0, 1, 2, 3)) == {"CUDA_VISIBLE_DEVICES": "3,1,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert launching.gpu_env(SPEC, None)["CUDA_VISIBLE_DEVICES"] == "3,1,2"  # not known yet: trusted
    none = dataclasses.replace(SPEC, gpus=())
    assert launching.gpu_env(none, (0, 1)) == {"CUDA_VISIBLE_DEVICES": ""}
    assert launching.gpu_env(none, ()) == {} and launching.gpu_env(none, None) == {}
    with pytest.raises(EngineError, match=r"asks for GPU 3, which this node does not have \(its GPUs: 0, 1, 2\)"):
        launching.gpu_env(SPEC, (0, 1, 2))
    with pytest.raises(EngineError, match="GPU 1 is listed twice"):
        launching.gpu_env(dataclasses.replace(SPEC, gpus=(1, 0, 1)), (0, 1))


def test_plan_puts_the_gpus_over_the_spec_env_and_the_agents(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A spec env naming CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER loses; its other variables stay."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    spec = dataclasses.replace(SPEC, gpus=(2,), env=(("CUDA_DEVICE_ORDER", "FASTEST_FIRST"),
                                                     ("CUDA_VISIBLE_DEVICES", "0"), ("NCCL_DEBUG", "INFO")))
    p = launching.plan(spec, engines.get("sim"), host="127.0.0.1", model_path=None, cpu_count=2,
                       run_dir=tmp_path, node=with_gpus(0, 1, 2, 3))
    assert (p.env["CUDA_VISIBLE_DEVICES"], p.env["CUDA_DEVICE_ORDER"], p.env["NCCL_DEBUG"]) == (
        "2", "PCI_BUS_ID", "INFO")
    cpu = launching.plan(dataclasses.replace(spec, gpus=()), engines.get("sim"), host="127.0.0.1", model_path=None,
                         cpu_count=2, run_dir=tmp_path, node=with_gpus())
    # A CPU node: the spec's values are dropped and the agent's own stand.
    assert (cpu.env["CUDA_VISIBLE_DEVICES"], cpu.env["CUDA_DEVICE_ORDER"]) == ("0,1,2,3", "FASTEST_FIRST")
