"""The kinds of node a simulated fleet is made of: each one's inventory, and how ``--mix`` weighs them.

An inventory is made up but shaped as a real agent reports it (8xH100 with NVLink, 4xL40S, CPU-only), and its
heartbeat is serialized once per kind, so a fleet of thousands sends bytes it did not build per beat.
"""

from __future__ import annotations

from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core.inventory import Gpu, Inventory

GIB = 2**30


def _gpus(n: int, name: str, mem_gib: int, cc: str, *, nvlink: bool) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, f"GPU-sim-{name}-{i}", name, mem_gib * GIB, 0, cc,
                     nvlink_peers=tuple(j for j in range(n) if j != i) if nvlink else ()) for i in range(n))


KINDS: dict[str, Inventory] = {
    "h100": Inventory(cpu_count=192, memory_total_bytes=2048 * GIB, memory_available_bytes=1900 * GIB,
                      gpus=_gpus(8, "NVIDIA H100 80GB HBM3", 80, "9.0", nvlink=True),
                      engines=(("sim", "fleet"), ("vllm", "0.11.0"), ("sglang", "0.5.0"))),
    "l40s": Inventory(cpu_count=64, memory_total_bytes=512 * GIB, memory_available_bytes=480 * GIB,
                      gpus=_gpus(4, "NVIDIA L40S", 48, "8.9", nvlink=False),
                      engines=(("sim", "fleet"), ("vllm", "0.11.0"))),
    "cpu": Inventory(cpu_count=32, memory_total_bytes=128 * GIB, memory_available_bytes=120 * GIB,
                     engines=(("sim", "fleet"), ("llamacpp", "fleet"))),
}


def parse_mix(text: str) -> list[tuple[str, float]]:
    """``"h100:0.5,l40s:0.3,cpu:0.2"`` -> weights; names must be in KINDS."""
    out = []
    for part in text.split(","):
        name, _, weight = part.strip().partition(":")
        if name not in KINDS:
            raise ValueError(f"unknown node kind {name!r} in --mix; known: {', '.join(KINDS)}")
        try:
            w = float(weight or 1)
        except ValueError:
            raise ValueError(f"--mix {part!r}: the weight must be a number") from None
        if w < 0:
            raise ValueError(f"--mix {part!r}: the weight must not be negative")
        out.append((name, w))
    if not any(w > 0 for _, w in out):
        raise ValueError(f"--mix {text!r}: at least one weight must be above 0")
    return out


def heartbeat_tail(inv: Inventory) -> bytes:
    """A heartbeat of ``inv`` without its seq, serialized: a node puts only its seq in front of it."""
    return pb.AgentMessage(heartbeat=pb.Heartbeat(
        memory_total_bytes=inv.memory_total_bytes, memory_available_bytes=inv.memory_available_bytes,
        gpus=convert.gpus_to_pb(inv.gpus))).SerializeToString()
