"""Issue 33's proof: a real agent in a network namespace that can only connect out (``testing.netns``) joins a real
server, gets a sim replica, and serves through the router over the tunnel it dialled; the same node with
``engine_access: direct`` is unreachable and the router says why; the tunnel cut (link down) and restored under load
fails no request that had no byte sent, and the replica comes back without its engine restarted. A standalone
``llmgw router`` serves the same node through the control plane's tunnel port, with its router token (refused once
the token is deleted), alone and with ``--workers 2`` (its workers through its hub's relay).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest

from llmgw.control import datadir
from llmgw.core import pki
from llmgw.testing import netns
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW, System, sim_model

WHY = netns.forbidden()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"no network namespace for a node behind NAT: {WHY}")


@pytest.fixture
def nat() -> Iterator[netns.Nat]:
    with netns.behind_nat() as made:
        yield made


def _system(root: Path, nat: netns.Nat) -> System:
    # The server listens beyond loopback, where the node dials it; its certificate names that address.
    # Two router processes: the in-process router and a worker reaching the tunnels through the server's relay.
    s = System(root, server_args=["--host", "0.0.0.0", "--plain-http", "--router-workers", "2"])
    done = datadir.init(s.data_dir, hosts=[nat.host_ip], database="")
    s.admin_password = done.admin_password or ""
    s.ca_hash = pki.ca_hash(datadir.read_ca(s.data_dir).cert_pem)
    s.start_server()
    return s


def _start_nat_agent(s: System, nat: netns.Nat, access: str) -> Proc:
    argv = [sys.executable, "-m", "llmgw", "agent", "join", "--server", f"{nat.host_ip}:{s.join_port}", "--token",
            s.join_token(), "--ca-hash", s.ca_hash, "--node-id", "nat1", "--state-dir", str(s.root / "nat1"),
            "--engine-access", access, "--mgmt-addr", nat.node_ip, "--heartbeat-interval", "1", "--stop-grace", "3"]
    proc = Proc.start(nat.exec_argv(argv), log_path=s.root / "agent-nat1.log", env={**os.environ})
    s.agents["nat1"] = proc
    wait_for(lambda: any(n["id"] == "nat1" and n["connected"] for n in s.get("/api/v1/nodes")["items"]),
             timeout=60, interval=0.2, what="the node behind NAT registered")
    return proc


def _client(s: System) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=60)


def _cli(s: System, *args: str) -> str:
    done = subprocess.run([*LLMGW, *args, "--url", s.url], capture_output=True, text=True, timeout=60,
                          env={**s.cli_env(), "COLUMNS": "300"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _access(s: System) -> dict:
    return dict(s.get("/api/v1/nodes/nat1")["engine_access"] or {})


def _nat_replica(s: System, model: str) -> dict:
    return next(r for r in s.replicas(model) if r["node"] == "nat1")


def test_a_node_behind_nat_serves_through_its_tunnel_and_survives_a_cut(tmp_path: Path, nat: netns.Nat) -> None:
    s = _system(tmp_path, nat)
    try:
        _start_nat_agent(s, nat, "tunnel")
        s.apply(sim_model("m", args=["--decode-tps", "200"]))
        s.wait_model("m", timeout=90)
        replica = _nat_replica(s, "m")
        assert replica["endpoint"].startswith("http://127.0.0.1:")  # the engine listens on the node's loopback only
        s.wait_router("m", 1, timeout=30)
        client = _client(s)
        for _ in range(5):  # no route to the node but its tunnel: each answer came through it
            got = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
            assert got.choices[0].message.content
        engines_before = s.engine_pids("nat1")
        assert engines_before
        # Which, and why, where a person looks.
        wide = next(line for line in _cli(s, "get", "nodes", "-o", "wide").splitlines() if line.startswith("nat1"))
        assert " tunnel " in wide, wide
        assert "tunnel: engine_access tunnel (its agent's setting); its tunnel is up" in _cli(s, "describe", "node",
                                                                                              "nat1")

        # A second node, reachable directly, and the model spread over both.
        s.start_agent("local1")
        s.apply(sim_model("m", replicas=2, placement="spread", args=["--decode-tps", "200"]))
        wait_for(lambda: sum(r["phase"] == "Ready" for r in s.replicas("m")) == 2, timeout=90, what="2 replicas")
        time.sleep(1.5)  # the router's table follows

        results = {"ok": 0, "failed_before_a_byte": 0, "failed_mid_stream": 0}
        errors: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                got_bytes = False  # the router's answer began (its status and headers): nothing can be re-sent
                try:
                    stream = client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True)
                    got_bytes = True
                    for _ in stream:
                        pass
                    kind = "ok"
                except Exception as exc:  # counted by kind: what the test asserts on
                    kind = "failed_mid_stream" if got_bytes else "failed_before_a_byte"
                    with lock:
                        errors.append(f"{kind}: {exc}")
                with lock:
                    results[kind] += 1

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            time.sleep(2)
            nat.link(up=False)  # the cable pulled: nothing reaches the node, its tunnel goes silent
            wait_for(lambda: "its tunnel is down: nothing heard" in _access(s)["reason"], timeout=20, interval=0.2,
                     what="the tunnel seen down")
            time.sleep(2)
            nat.link(up=True)
            wait_for(lambda: "nat1: tunnel up" in (s.root / "server.log").read_text().split("tunnel down")[-1],
                     timeout=60, interval=0.2, what="the tunnel dialled again")
            time.sleep(3)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=90)
        log = (s.root / "server.log").read_text()
        assert "node nat1: tunnel down" in log, "the cut was not seen"
        assert results["failed_before_a_byte"] == 0, (results, errors[:5])
        assert results["ok"] > 20, results
        assert _nat_replica(s, "m")["phase"] == "Ready"
        assert s.engine_pids("nat1") == engines_before, "the engine was restarted"
        # Ready in the router again: with the direct node gone, every answer comes through the tunnel.
        s.stop_agent("local1")
        wait_for(lambda: len([r for r in s.replicas("m") if r["phase"] == "Ready"]) == 1, timeout=60,
                 what="local1's replica gone")
        got = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert got.choices[0].message.content
    finally:
        s.close()


def test_the_same_node_with_direct_access_is_unreachable_and_the_router_says_why(tmp_path: Path,
                                                                                 nat: netns.Nat) -> None:
    s = _system(tmp_path, nat)
    try:
        _start_nat_agent(s, nat, "direct")
        s.apply(sim_model("m"))
        s.wait_model("m", timeout=90)  # Ready: its agent probes it on the node, where it answers
        assert nat.node_ip in _nat_replica(s, "m")["endpoint"]
        assert _access(s) == {"mode": "direct", "reason": "engine_access direct (its agent's setting)"}
        time.sleep(1.5)
        with pytest.raises(openai.APIStatusError) as refused:
            _client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert refused.value.status_code == 502
        assert f"cannot connect to https://{nat.node_ip}" in str(refused.value), str(refused.value)

        def ejected() -> bool:  # failures in a row eject it (one may be a blip), in whichever router process
            with pytest.raises(openai.APIStatusError):
                _client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                   max_tokens=4)
            return "ejected" in (s.root / "server.log").read_text()
        wait_for(ejected, timeout=90, interval=0.1, what="the ejection")
    finally:
        s.close()


def test_auto_finds_the_engines_unreachable_and_serves_them_through_the_tunnel(tmp_path: Path,
                                                                                nat: netns.Nat) -> None:
    s = _system(tmp_path, nat)
    try:
        _start_nat_agent(s, nat, "auto")
        s.apply(sim_model("m"))
        s.wait_model("m", timeout=90)
        # The engine listens at the node's address, with TLS (beyond loopback); the check cannot connect to it.
        assert _nat_replica(s, "m")["endpoint"].startswith(f"https://{nat.node_ip}:")
        access = wait_for(lambda: (a := _access(s)).get("mode") == "tunnel" and "tunnel is up" in a["reason"] and a,
                          timeout=60, interval=0.2, what="auto deciding on the tunnel")
        assert f"could not reach its engines (no connection to {nat.node_ip}:" in access["reason"], access
        s.wait_router("m", 1, timeout=30)  # through the tunnel; the agent speaks TLS to its engine
        got = _client(s).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4)
        assert got.choices[0].message.content
    finally:
        s.close()


@pytest.mark.parametrize("workers", ["1", "2"])  # 2: the hub's workers, through its relay, with the hub's token
def test_a_standalone_router_serves_the_node_through_the_control_planes_tunnel_port(tmp_path: Path, nat: netns.Nat,
                                                                                   workers: str) -> None:
    s = _system(tmp_path, nat)
    router: Proc | None = None
    try:
        _start_nat_agent(s, nat, "tunnel")
        s.apply(sim_model("m", args=["--decode-tps", "200"]))
        s.wait_model("m", timeout=90)
        token = s.request("POST", "/api/v1/routers", json={"name": "edge"}).json()["token"]
        (tmp_path / "router.token").write_text(token + "\n")
        port = free_port()
        router = Proc.start([*LLMGW, "router", "--control", s.url, "--token-file", str(tmp_path / "router.token"),
                             "--port", str(port), "--workers", workers, "--log-level", "info"],
                           log_path=tmp_path / "router.log")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        messages = [{"role": "user", "content": "hi"}]

        def served() -> bool:
            try:
                return bool(client.chat.completions.create(model="m", messages=messages, max_tokens=4).choices)
            except (openai.APIConnectionError, openai.APIStatusError):
                return False
        wait_for(served, timeout=60, interval=0.2, what="the standalone router serving through the tunnel")
        # The node's engine listens on its loopback: nothing but the tunnel reaches it. Streams too.
        for _ in range(3):
            chunks = list(client.chat.completions.create(model="m", messages=messages, max_tokens=8, stream=True))
            assert any(c.choices and c.choices[0].delta.content for c in chunks)
        # Each over a connection of its own: the kernel spreads them over the workers, each through the tunnel.
        for _ in range(8):
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                               timeout=60) as each:
                assert each.chat.completions.create(model="m", messages=messages, max_tokens=4).choices
        assert "ejected" not in router.log_tail(200)
        # The router token stays in the hub: its workers were given only their secret (never on argv either).
        workers_seen = psutil.Process(router.popen.pid).children()
        assert len(workers_seen) == (2 if workers == "2" else 0)
        for worker in workers_seen:
            assert token not in " ".join(worker.cmdline()) and token not in worker.environ().values()
        # Its token deleted: the tunnel port refuses it (the table it holds names the replica still).
        assert s.request("DELETE", "/api/v1/routers/edge").status_code == 200

        def refused() -> str:
            try:
                client.chat.completions.create(model="m", messages=messages, max_tokens=4)
            except openai.APIStatusError as exc:
                return str(exc)
            return ""
        said = wait_for(refused, timeout=30, interval=0.2, what="the deleted token refused")
        assert "takes only a router token the control plane knows" in said, said
    finally:
        if router is not None:
            router.stop()
        s.close()
