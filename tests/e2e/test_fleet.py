"""The fleet simulator against a real control plane: fake nodes register, take replicas, survive a restart, stop."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _stats(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _metrics(system: System) -> dict[str, float]:
    text = system.request("GET", "/metrics").text
    return {s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()) if k != "le"): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if "le" not in s.labels}


def test_fleet_registers_takes_replicas_and_stops(tmp_path: Path) -> None:
    """20 simulated nodes register over gRPC, 10 replicas are placed across them and Ready, SIGTERM ends it."""
    system = System(tmp_path, secure=False)  # the simulated fleet dials plaintext: --insecure, loopback
    fleet = None
    stats_file = tmp_path / "fleet-stats.json"
    try:
        system.start_server()
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--server", f"127.0.0.1:{system.agent_port}", "--nodes", "20",
                            "--mix", "h100:1,cpu:1", "--heartbeat", "1", "--stats-file", str(stats_file)],
                           log_path=tmp_path / "fleet.log")
        wait_for(lambda: sum(n["connected"] for n in system.get("/api/v1/nodes")["items"]) == 20, timeout=30,
                 interval=0.2, what="20 simulated nodes registered")
        system.apply(sim_model("wide", replicas=10))
        system.wait_model("wide", timeout=30)
        nodes = {r["node"] for r in system.replicas("wide")}
        assert len(nodes) == 10  # spread: one replica per node while nodes are free
        gpus = [len(n["gpus"]) for n in system.get("/api/v1/nodes")["items"]]
        assert set(gpus) <= {0, 8} and 8 in gpus
        wait_for(lambda: _stats(stats_file).get("shards_ready") == 10, timeout=10, what="fleet stats: 10 Ready")
        stats = _stats(stats_file)
        assert stats["registered"] == 20 and stats["starts"] == 10 and stats["stops"] == 0
        # Every node beats once a second: the server counted and timed them.
        wait_for(lambda: _metrics(system).get("llmgw_heartbeat_handling_seconds_count", 0) >= 20, timeout=10,
                 what="heartbeats timed by the server")
        m = _metrics(system)
        assert m["llmgw_agent_registrations_total"] == 20
        assert m["llmgw_agent_messages_total{kind=heartbeat}"] == m["llmgw_heartbeat_handling_seconds_count"]
        assert m["llmgw_event_loop_wait_seconds_count"] > 0

        fleet.signal(signal.SIGTERM)
        assert fleet.popen.wait(timeout=15) == 0
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()


def test_fleet_survives_a_control_plane_restart_without_commands(tmp_path: Path) -> None:
    """After a server restart every simulated node re-registers with its shards and no Start or Stop is sent."""
    system = System(tmp_path, secure=False)  # the simulated fleet dials plaintext: --insecure, loopback
    fleet = None
    stats_file = tmp_path / "fleet-stats.json"
    try:
        system.start_server()
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--server", f"127.0.0.1:{system.agent_port}", "--nodes", "30",
                            "--mix", "l40s:1,cpu:1", "--heartbeat", "1", "--stats-file", str(stats_file)],
                           log_path=tmp_path / "fleet.log")
        wait_for(lambda: _stats(stats_file).get("registered") == 30, timeout=30, what="30 registered")
        system.apply(sim_model("pair", replicas=40))
        system.wait_model("pair", timeout=30)
        wait_for(lambda: _stats(stats_file).get("shards_ready") == 40, timeout=10, what="fleet stats: 40 Ready")
        before = _stats(stats_file)

        system.stop_server()
        system.start_server()  # same data directory and ports
        wait_for(lambda: _stats(stats_file).get("sessions", 0) >= before["sessions"] + 30, timeout=30,
                 what="30 nodes re-registered")
        wait_for(lambda: sum(n["connected"] for n in system.get("/api/v1/nodes")["items"]) == 30, timeout=30,
                 what="server sees 30 connected")
        assert system.model_status("pair")["ready_replicas"] == 40
        # Two heartbeats from every node: every registration has been through reconcile passes since.
        wait_for(lambda: _metrics(system).get("llmgw_heartbeat_handling_seconds_count", 0) >= 60, timeout=15,
                 what="two heartbeats from every node after the restart")
        after = _stats(stats_file)
        assert (after["starts"], after["stops"], after["drains"]) == (before["starts"], before["stops"],
                                                                       before["drains"])
        assert after["shards_ready"] == 40
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()
