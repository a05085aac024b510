"""The fleet simulator against a real control plane: fake nodes register, take replicas, leave on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def test_fleet_registers_takes_replicas_and_stops(tmp_path: Path) -> None:
    """20 simulated nodes register over gRPC, 10 replicas are placed across them and Ready, SIGTERM ends it."""
    system = System(tmp_path)
    fleet = None
    try:
        system.start_server()
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--server", f"127.0.0.1:{system.agent_port}", "--nodes", "20",
                            "--mix", "h100:1,cpu:1", "--heartbeat", "1"], log_path=tmp_path / "fleet.log")
        wait_for(lambda: sum(n["connected"] for n in system.get("/api/v1/nodes")["items"]) == 20, timeout=30,
                 interval=0.2, what="20 simulated nodes registered")
        system.apply(sim_model("wide", replicas=10))
        system.wait_model("wide", timeout=30)
        nodes = {r["node"] for r in system.replicas("wide")}
        assert len(nodes) == 10  # spread: one replica per node while nodes are free
        gpus = [len(n["gpus"]) for n in system.get("/api/v1/nodes")["items"]]
        assert set(gpus) <= {0, 8} and 8 in gpus
        fleet.signal(signal.SIGTERM)
        assert fleet.popen.wait(timeout=15) == 0
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()
