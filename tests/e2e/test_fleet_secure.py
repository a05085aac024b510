"""The fleet simulator onboards as real nodes do: one many-use token, a certificate each, mutual TLS, renewal.

Against a secure control plane (``llmgw init``'s CA, the join port, the agent port with mutual TLS):
20 simulated nodes join with one 20-use token and register, each as the node its certificate names;
with a short certificate life they renew over their streams, and after a server restart they all
connect again with the renewed certificates. Without a token the fleet says why and exits 1, where it
used to log "0/N registered" for ever.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _stats(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _connected(system: System) -> int:
    return sum(n["connected"] for n in system.get("/api/v1/nodes")["items"])


def test_fleet_joins_with_one_token_dials_mtls_and_renews(tmp_path: Path) -> None:
    """20 nodes join with one token, register over mutual TLS, take replicas, renew, and reconnect renewed."""
    system = System(tmp_path, server_args=["--node-cert-validity", "30s"])
    fleet = None
    stats_file = tmp_path / "fleet-stats.json"
    try:
        system.start_server()
        token = system.join_token(uses=20)
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--join", f"127.0.0.1:{system.join_port}", "--token", token,
                            "--ca-hash", system.ca_hash, "--nodes", "20", "--mix", "h100:1,cpu:1", "--heartbeat", "1",
                            "--stats-file", str(stats_file), "--state-dir", str(tmp_path / "fleet-state")],
                           log_path=tmp_path / "fleet.log")
        wait_for(lambda: _connected(system) == 20, timeout=60, interval=0.2, what="20 simulated nodes registered")
        wait_for(lambda: _stats(stats_file).get("registered") == 20, timeout=10, what="fleet stats: 20 registered")
        assert _stats(stats_file)["joined"] == 20
        # Each node's certificate names it: the server checked the Register against it.
        certs = system.get("/api/v1/nodes")["items"]
        assert {n["id"] for n in certs} == {f"sim-{i:05d}" for i in range(20)}
        system.apply(sim_model("wide", replicas=10))
        system.wait_model("wide", timeout=30)

        # Two thirds into a 30 s life every node renews over its stream, without reconnecting.
        wait_for(lambda: _stats(stats_file).get("renewed", 0) >= 20, timeout=60, interval=0.5,
                 what="20 certificates renewed")
        stats = _stats(stats_file)
        assert stats["renew_errors"] == 0 and stats["sessions"] == 20
        # A restarted server is dialled with the renewed certificates, and takes them.
        system.stop_server()
        system.start_server()
        wait_for(lambda: _stats(stats_file).get("sessions", 0) >= 40, timeout=60, what="20 nodes back")
        wait_for(lambda: _connected(system) == 20, timeout=30, what="server sees 20 connected")
        after = _stats(stats_file)
        assert after["starts"] == stats["starts"] and after["stops"] == 0
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()


def test_fleet_without_a_token_against_a_secure_server_says_why_and_exits_1(tmp_path: Path) -> None:
    """No --token/--ca-hash and a TLS agent port: the fleet names the cause and the flags, exit status 1."""
    system = System(tmp_path)
    fleet = None
    try:
        system.start_server()
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--server", f"127.0.0.1:{system.agent_port}", "--nodes", "3"],
                           log_path=tmp_path / "fleet.log")
        assert fleet.popen.wait(timeout=60) == 1
        text = (tmp_path / "fleet.log").read_text()
        assert "speaks TLS" in text and "--token" in text and "--ca-hash" in text, text
        assert "0/3 registered" not in text
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()


def test_a_token_with_too_few_uses_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A 2-use token for 3 nodes: the join refusal reaches the user with the way out, and the fleet exits 1."""
    system = System(tmp_path)
    fleet = None
    try:
        system.start_server()
        fleet = Proc.start([*LLMGW, "sim", "fleet", "--join", f"127.0.0.1:{system.join_port}", "--token",
                            system.join_token(uses=2), "--ca-hash", system.ca_hash, "--nodes", "3",
                            "--join-in-flight", "1"], log_path=tmp_path / "fleet.log")
        assert fleet.popen.wait(timeout=60) == 1
        text = (tmp_path / "fleet.log").read_text()
        assert "refused to join node" in text and "--uses N" in text, text
    finally:
        if fleet is not None:
            fleet.stop()
        system.close()
