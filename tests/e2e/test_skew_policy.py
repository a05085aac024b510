"""The skew policy (``core.skew``, the README's "Versions and upgrades") at the connection, against a real server and
real agents over mutual TLS:

- an agent newer than the control plane (protocol 3, one that says so with ``LLMGW_AGENT_PROTOCOL``) is refused with
  the sentence naming both versions, which the agent logs at ERROR once however often it redials;
- an agent one protocol older (the previous release's) is served, and one at another llmgw version shows as a skew
  in ``llmgw get nodes`` (table and JSON) and ``llmgw describe node``, its version change told as an event; a
  legacy agent (protocol 0, as 0.1.0 registers: two protocols behind) is refused as too old;
- a router's table request with a protocol newer than the control plane's is refused with 409 and the sentence (a
  real ``TableWatcher`` then logs it and installs nothing), one a protocol older is answered, with the control
  plane's own protocol and version in the answer's headers, and one without the header (0.1.0) is refused as too old;
- a control plane starting at another version than the cluster's last leader tells it as an event.

A control plane too old for the agent (0.1.0's, answering no protocol) is ``tests/unit/test_agent_skew.py``'s, and
the router's own refusal of a control plane too old for it ``tests/unit/test_router_skew.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.agent import nodepki
from llmgw.agent.session import dial
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.control import cpversions, datadir
from llmgw.core import skew
from llmgw.core.version import version
from llmgw.router import watch
from llmgw.router.table import TableHolder
from llmgw.testing import system as system_mod
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW, System

pytestmark = pytest.mark.timeout(300)
HEAD = version()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One server, one agent (node1) at this release, for the module."""
    with system_mod.running(tmp_path_factory.mktemp("skew")) as s:
        yield s


def _cli(s: System, *args: str) -> subprocess.CompletedProcess[str]:
    # Wide: Rich wraps a table to 80 columns without a terminal, and a wrapped cell splits the words checked.
    return subprocess.run([*LLMGW, *args, "--url", s.url], capture_output=True, text=True, timeout=60,
                          env={**s.cli_env(), "COLUMNS": "300"})


def _row(table: str, node_id: str) -> list[str]:
    """A node's row of `llmgw get nodes`, cell by cell: piped, the CLI prints plain columns with at least two
    spaces between them (llmgw.cli.output), and a cell has at most single spaces ("0.1.0 (skew)")."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in table.splitlines() if line.strip()]
    found = [r for r in rows if r[0] == node_id]
    assert found, table
    return found[0]


def _errors(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if " ERROR " in line]


def test_an_agent_newer_than_the_control_plane_is_refused_naming_both_versions(cluster: System) -> None:
    log = cluster.root / "agent-new1.log"
    env = {**os.environ, "LLMGW_AGENT_PROTOCOL": str(skew.PROTOCOL + 1), "LLMGW_AGENT_RECONNECT_BASE": "0.1",
           "LLMGW_AGENT_RECONNECT_MAX": "0.3"}
    proc = Proc.start([*cluster.agent_command("new1"), "--heartbeat-interval", "1"], log_path=log, env=env)
    try:
        server_log = cluster.root / "server.log"

        def refusals() -> int:
            return server_log.read_text(errors="replace").count("is newer than the control plane")

        wait_for(lambda: refusals() >= 4, timeout=60, what="four Registers of the newer agent refused")
        said = (f"this agent {HEAD} (protocol {skew.PROTOCOL + 1}) is newer than the control plane {HEAD} "
                f"(protocol {skew.PROTOCOL}): an agent may not be newer than its control plane; upgrade the control "
                "planes first (standby, then leader)")
        errors = _errors(log)
        assert len(errors) == 1, errors  # once for the outage, not once per Register
        assert said in errors[0]
        assert proc.poll() is None  # it dials on: the control plane may be upgraded in a minute
        assert not any(n["id"] == "new1" and n["connected"] for n in cluster.get("/api/v1/nodes")["items"])
    finally:
        proc.stop(timeout=15)


#: The previous release's version and protocol, as its agents say them.
PREVIOUS = ("0.2.0", skew.PROTOCOL - 1)


async def _register_as(addr: str, state_dir: Path, node_id: str, version: str, protocol: int) -> pb.Ack:
    """What an agent of another release sends on the node's certificate: a Register at its version and protocol
    (0.1.0 sent none: 0)."""
    async with dial.channel(addr, nodepki.of(state_dir)) as channel:
        await dial.connect(channel)
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
        await call.write(pb.AgentMessage(seq=1, register=pb.Register(
            node_id=node_id, hostname=node_id, agent_version=version, protocol=protocol, mgmt_addr="127.0.0.1")))
        first = await call.read()
        call.cancel()
        return first.ack


def test_an_agent_a_protocol_older_is_served_and_its_version_shown_as_a_skew(cluster: System) -> None:
    """One protocol older (the previous release's) is inside the policy: the real agent registers so, and a Register
    at the previous release's version on the node's certificate is accepted and shown as a skew, its change an event
    each way. Two protocols older (0.1.0's, none sent) is refused as too old, naming the upgrade."""
    old_version, old_protocol = PREVIOUS
    cluster.stop_agent("node1")
    cluster.agent_env = {"LLMGW_AGENT_PROTOCOL": str(old_protocol)}
    try:
        cluster.start_agent("node1")  # waits until it registered: N-1 is served
    finally:
        cluster.agent_env = {}
    table = _cli(cluster, "get", "nodes")
    assert table.returncode == 0, table.stderr
    assert _row(table.stdout, "node1")[-1] == HEAD  # VERSION, no skew
    cluster.stop_agent("node1")

    addr = f"127.0.0.1:{cluster.agent_port}"
    legacy = asyncio.run(_register_as(addr, cluster.root / "node1", "node1", "0.1.0", 0))
    assert not legacy.ok
    assert legacy.error.startswith(f"this agent 0.1.0 (protocol 1) is too old for the control plane {HEAD} "
                                   f"(protocol {skew.PROTOCOL})"), legacy.error
    ack = asyncio.run(_register_as(addr, cluster.root / "node1", "node1", old_version, old_protocol))
    assert ack.ok, ack.error
    assert (ack.protocol, ack.server_version) == (skew.PROTOCOL, HEAD)  # every answer says the control plane's

    table = _cli(cluster, "get", "nodes")
    assert _row(table.stdout, "node1")[-1] == f"{old_version} (skew)"
    as_json = _cli(cluster, "get", "nodes", "-o", "json")
    node = next(n for n in json.loads(as_json.stdout) if n["id"] == "node1")
    assert (node["agent_version"], node["version_skew"]) == (old_version, True)
    described = _cli(cluster, "describe", "node", "node1")
    assert f"{old_version} (skew)" in described.stdout, described.stdout

    cluster.start_agent("node1")  # back at this release
    node = next(n for n in cluster.get("/api/v1/nodes")["items"] if n["id"] == "node1")
    assert (node["agent_version"], node["version_skew"]) == (HEAD, False)

    def changes() -> list[str]:
        return [e["message"] for e in cluster.get("/api/v1/events?limit=200")["items"]
                if e["reason"] == "AgentVersionChanged" and e["object"] == "node/node1"]

    wait_for(lambda: len(changes()) >= 2, timeout=30, what="both version changes as events")
    assert f"agent {HEAD} → {old_version}" in changes() and f"agent {old_version} → {HEAD}" in changes()


def test_a_router_newer_than_the_control_plane_or_two_protocols_older_is_refused_and_one_older_is_served(
        cluster: System, caplog: pytest.LogCaptureFixture) -> None:
    token = cluster.request("POST", "/api/v1/routers", json={"name": "edge-skew"}).json()["token"]
    auth = {"Authorization": f"Bearer {token}"}
    url = f"{cluster.url}/api/v1/endpoints?timeout=0"
    with httpx.Client(verify=cluster.ssl_context() or True, timeout=30) as http:
        newer = http.get(url, headers={**auth, **skew.headers(skew.PROTOCOL + 1, "9.9.9")})
        legacy = http.get(url, headers=auth)  # 0.1.0's router says no protocol
        older = http.get(url, headers={**auth, **skew.headers(PREVIOUS[1], PREVIOUS[0])})
        same = http.get(url, headers={**auth, **skew.headers(skew.PROTOCOL, HEAD)})
    assert newer.status_code == 409, newer.text
    error = newer.json()["error"]
    assert error["code"] == skew.REFUSAL_CODE
    assert error["message"].startswith(f"this router 9.9.9 (protocol {skew.PROTOCOL + 1}) is newer than the control "
                                       f"plane {HEAD} (protocol {skew.PROTOCOL})")
    assert newer.headers[skew.PROTOCOL_HEADER] == str(skew.PROTOCOL)
    assert legacy.status_code == 409, legacy.text
    assert legacy.json()["error"]["message"].startswith(
        f"this router of an unknown version (protocol 1) is too old for the control plane {HEAD}"), legacy.text
    for answer in (older, same):
        assert answer.status_code == 200, answer.text
        assert "models" in answer.json()
        assert answer.headers[skew.PROTOCOL_HEADER] == str(skew.PROTOCOL)
        assert answer.headers[skew.VERSION_HEADER] == HEAD

    async def follow() -> bool:
        holder = TableHolder()
        watcher = watch.TableWatcher(cluster.url, holder, headers=auth, ssl_context=cluster.ssl_context(),
                                     protocol=skew.PROTOCOL + 1, router_version="9.9.9", backoff_min_s=0.05,
                                     backoff_max_s=0.1)
        await watcher.start()
        try:
            return await watcher.wait_loaded(2.0)
        finally:
            await watcher.stop()

    with caplog.at_level(logging.DEBUG, logger=watch.__name__):
        assert asyncio.run(follow()) is False  # refused: no table installed
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and error["message"] in errors[0], errors


def test_a_control_plane_at_another_version_than_the_last_leader_is_an_event(tmp_path: Path) -> None:
    s = System(tmp_path)
    try:
        s.start_server()
        s.stop_server()
        store = datadir.open_store(s.data_dir, s.database)
        try:
            assert store.settings()[cpversions.KEY] == HEAD  # the first leader's version, kept
            store.put_settings({cpversions.KEY: "0.1.0"})  # as if 0.1.0 had led the cluster last
        finally:
            store.close()
        s.start_server()

        def changes() -> list[str]:
            return [e["message"] for e in s.get("/api/v1/events?limit=200")["items"]
                    if e["reason"] == "ControlPlaneVersionChanged"]

        wait_for(changes, timeout=30, what="the control plane's version change as an event")
        assert changes()[0].startswith(f"control plane 0.1.0 → {HEAD} (")
    finally:
        s.close()


def test_llmgw_version_lists_each_router_with_its_version(cluster: System, tmp_path: Path) -> None:
    """A standalone router says its version in its load reports; `llmgw version` lists it beside the agents."""
    token_file = tmp_path / "router.token"
    token_file.write_text(cluster.request("POST", "/api/v1/routers", json={"name": "edge-v"}).json()["token"] + "\n")
    port = free_port()
    router = Proc.start([*LLMGW, "router", "--control", cluster.url, "--port", str(port), "--token-file",
                         str(token_file), "--router-id", "edge-v1", "--log-level", "info"],
                        log_path=tmp_path / "router.log")
    try:
        wait_for(lambda: any(r["id"] == "edge-v1" for r in cluster.get("/api/v1/router/versions")["routers"]),
                 timeout=30, what="the router's first load report")
        seen = next(r for r in cluster.get("/api/v1/router/versions")["routers"] if r["id"] == "edge-v1")
        assert (seen["version"], seen["protocol"]) == (HEAD, skew.PROTOCOL)
        done = _cli(cluster, "version")
        assert done.returncode == 0, done.stderr
        assert ["router", "edge-v1", HEAD] in [line.split() for line in done.stdout.splitlines()], done.stdout
    finally:
        router.stop()


def test_a_servers_router_workers_take_its_table(tmp_path: Path) -> None:
    """`llmgw server --router-workers 2`: the workers are routers following the server's internal hub, which says
    this release's protocol, so they take its table and serve (none refuses it as a control plane too old)."""
    with system_mod.running(tmp_path, server_args=["--router-workers", "2"]) as s:
        s.apply(system_mod.sim_model("m"))
        s.wait_model("m")
        for _ in range(8):  # a connection each, spread over the processes sharing the port
            with httpx.Client(verify=s.ssl_context() or True, timeout=30) as http:
                answer = http.post(f"{s.url}/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            assert answer.status_code == 200, answer.text
        logged = (tmp_path / "server.log").read_text(errors="replace")
        assert "do not work together" not in logged
        assert logged.count("route table v") >= 2, logged[-3000:]  # the workers' first tables (and the server's)
