"""Two control planes on one real PostgreSQL: one leads, the other takes over, and nothing restarts.

Each test starts its own servers and agents (real processes, mutual TLS, sim engines) against a database of
its own on one PostgreSQL server the module starts. The lease is short (``--lease 2s``) so a takeover is
quick here; ``bench/failover.py`` measures the defaults.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import sqlalchemy as sa
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory

from llmgw.control.store.store import MIGRATIONS
from llmgw.testing.load import Load
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW, System, sim_model

LEASE = ("--lease", "2s", "--lease-renew", "0.25s")
#: A node's grace: a paused leader is found dead by the agent's keepalive (10 s + 5 s), then a TLS handshake
#: that hangs on it times out (5 s) before the agent dials the standby; 30 s (the default) is close to that here.
GRACE_S = 60.0
_names = itertools.count(1)


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    """One PostgreSQL server for the module, stopped by pid at the end whatever happened."""
    with Postgres() as server:
        yield server


@pytest.fixture
def pair(tmp_path: Path, pg: Postgres) -> Iterator[tuple[System, System]]:
    """Control plane A (leads: started first) and B (stands by), one cluster: B was initialised with A's CA."""
    url = pg.create_database(f"ha{next(_names)}")
    a = System(tmp_path / "a", database=url, server_args=LEASE, node_grace_s=GRACE_S)
    b = System(tmp_path / "b", database=url, ca_from=tmp_path / "a" / "data" / "pki", server_args=LEASE,
               node_grace_s=GRACE_S)
    try:
        a.start_server()
        b.token = a.token
        b.start_server()
        wait_for(lambda: roles(b) == {"leader": 1, "standby": 1}, timeout=20, what="one leader, one standby")
        yield a, b
    finally:
        b.close()
        a.close()


def controlplanes(s: System) -> list[dict[str, Any]]:
    return list(s.get("/api/v1/controlplanes")["controlplanes"])


def roles(s: System) -> dict[str, int]:
    out: dict[str, int] = {}
    for cp in controlplanes(s):
        out[cp["role"]] = out.get(cp["role"], 0) + 1
    return out


def leader_of(s: System) -> dict[str, Any] | None:
    return next((cp for cp in controlplanes(s) if cp["role"] == "leader"), None)


def instance(s: System) -> str:
    return str(s.get("/api/v1/controlplanes")["self"])


def connected(s: System, *nodes: str) -> bool:
    items = {n["id"]: n for n in s.get("/api/v1/nodes")["items"]}
    return all(items.get(n, {}).get("connected") for n in nodes)


def commands_received(s: System, node: str) -> list[str]:
    """The start, stop and drain commands the agent logged receiving."""
    text = (s.root / f"agent-{node}.log").read_text(errors="replace")
    return [line for line in text.splitlines() if "command from the control plane" in line]


def test_one_leads_the_standby_serves_routers_and_forwards_the_api(pair: tuple[System, System]) -> None:
    """Both see the same leader; agents sent to the standby are redirected to it; the standby answers the REST
    API by forwarding it (a model applied through B runs), and its router serves that model from the table it
    reads from the database."""
    a, b = pair
    lead = leader_of(b)
    assert lead is not None and lead["id"] == instance(a) and lead["term"] >= 1
    seen_by_a = leader_of(a)
    assert seen_by_a is not None and (seen_by_a["id"], seen_by_a["term"]) == (lead["id"], lead["term"])
    assert lead["http_url"] == a.url and lead["agent_addr"] == f"127.0.0.1:{a.agent_port}"
    # An agent told only of the standby is sent on to the leader. (It joins through the leader: a standby
    # issues no certificates.)
    state = b.root / "node1"
    joined = subprocess.run([*LLMGW, "agent", "join", *a.join_args("node1"), "--node-id", "node1", "--state-dir",
                             str(state), "--join-only"], capture_output=True, text=True, timeout=60)
    assert joined.returncode == 0, joined.stderr
    b.agents["node1"] = Proc.start([*LLMGW, "agent", "--server", f"127.0.0.1:{b.agent_port}", "--node-id", "node1",
                                    "--state-dir", str(state), "--heartbeat-interval", "1"],
                                   log_path=b.root / "agent-node1.log")
    wait_for(lambda: connected(a, "node1"), timeout=30, what="node1 registered with the leader")
    assert f"127.0.0.1:{a.agent_port}" in (b.root / "agent-node1.log").read_text()
    applied = b.request("POST", "/api/v1/models", json=sim_model("via-b"))
    assert applied.status_code in (200, 201), applied.text
    assert applied.headers.get("x-llmgw-forwarded-by") == instance(b)
    a.wait_model("via-b", timeout=60)
    b.wait_router("via-b", 1, timeout=20)
    out = openai.OpenAI(base_url=f"{b.url}/v1", api_key="unused", max_retries=0).chat.completions.create(
        model="via-b", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert out.choices[0].message.content


def test_killing_the_leader_under_load_fails_no_request_and_restarts_no_engine(pair: tuple[System, System]) -> None:
    """kill -9 of the leader while requests flow through the standby's router: B leads, both agents register
    with it, not one request fails, no engine is started or stopped, and the replicas stay Ready."""
    a, b = pair
    for node in ("node1", "node2"):
        a.start_agent(node)
    a.apply(sim_model("m", replicas=2))
    a.wait_model("m", timeout=60)
    b.wait_router("m", 2, timeout=20)
    engines = a.engine_pids("node1") | a.engine_pids("node2")
    assert len(engines) >= 2
    before = {n: len(commands_received(a, n)) for n in ("node1", "node2")}
    assert sum(before.values()) >= 2  # each replica's StartShard was logged: the count below means something
    with Load(b.url, "m", clients=2) as load:
        time.sleep(1.0)
        assert a.server is not None
        a.server.signal(signal.SIGKILL)
        a.server.stop(timeout=5)
        a.server = None
        wait_for(lambda: (lead := leader_of(b)) is not None and lead["id"] == instance(b), timeout=30,
                 what="B leads")
        wait_for(lambda: connected(b, "node1", "node2"), timeout=30, what="both agents registered with B")
        b.wait_model("m", timeout=30)
        time.sleep(1.0)
    assert load.failures == [] and load.ok > 10, (load.ok, load.failures[:5])
    assert a.engine_pids("node1") | a.engine_pids("node2") == engines
    after = {n: commands_received(a, n)[before[n]:] for n in ("node1", "node2")}
    assert after == {"node1": [], "node2": []}, after
    assert [r["phase"] for r in b.replicas("m")] == ["Ready", "Ready"]


def test_a_paused_leader_wakes_deposed_and_writes_nothing(pair: tuple[System, System]) -> None:
    """SIGSTOP the leader until its lease expired and B leads; after SIGCONT it finds the lease taken, stands
    by (its REST API now forwards to B) and sends no command: the engine it had started runs on untouched."""
    a, b = pair
    a.start_agent("node1")
    a.apply(sim_model("m"))
    a.wait_model("m", timeout=60)
    engines = a.engine_pids("node1")
    before = len(commands_received(a, "node1"))
    assert before >= 1
    assert a.server is not None
    a.server.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: (lead := leader_of(b)) is not None and lead["id"] == instance(b), timeout=30,
                 what="B leads")
        # The agent finds the frozen stream dead by keepalive (10 s + 5 s), then goes to B.
        wait_for(lambda: connected(b, "node1"), timeout=60, what="node1 registered with B")
    finally:
        a.server.signal(signal.SIGCONT)
    log = a.root / "server.log"
    wait_for(lambda: "no longer leads" in log.read_text(errors="replace"), timeout=20, what="A steps down")
    lead = leader_of(a)
    assert lead is not None and lead["id"] == instance(b) and lead["term"] >= 2
    applied = a.request("POST", "/api/v1/models", json=sim_model("after"))
    assert applied.status_code in (200, 201) and applied.headers.get("x-llmgw-forwarded-by") == instance(a)
    b.wait_model("after", timeout=60)
    assert a.engine_pids("node1") >= engines
    assert not [c for c in commands_received(a, "node1")[before:] if "shard m-" in c], "A's commands reached node1"


def test_the_database_restarting_under_the_leader_restarts_nothing(pair: tuple[System, System],
                                                                   pg: Postgres) -> None:
    """PostgreSQL stopped and started again under a leading control plane: a leader afterwards (the same, or
    the other having taken over), the replica untouched and Ready, and the store writable again."""
    a, b = pair
    a.start_agent("node1")
    a.apply(sim_model("m"))
    a.wait_model("m", timeout=60)
    engines = a.engine_pids("node1")
    before = len(commands_received(a, "node1"))
    assert before >= 1
    pg.restart(down_s=1.0)
    wait_for(lambda: leader_of(b) is not None, timeout=30, what="a leader after the restart")
    lead = leader_of(b)
    assert lead is not None
    leading = a if lead["id"] == instance(a) else b
    wait_for(lambda: connected(leading, "node1"), timeout=60, what="node1 with the leader")
    leading.apply(sim_model("after"))
    leading.wait_model("after", timeout=60)
    leading.wait_model("m", timeout=30)
    assert a.engine_pids("node1") >= engines
    assert not [c for c in commands_received(a, "node1")[before:] if "shard m-" in c]


def test_servers_started_together_on_an_empty_database_migrate_it_once(tmp_path: Path, pg: Postgres) -> None:
    """Three servers started at the same moment against an empty database: all come up, the schema is at the
    head revision once, and exactly one leads."""
    url = pg.create_database(f"ha{next(_names)}")
    servers: list[Proc] = []
    ports = [free_port() for _ in range(3)]
    try:
        for i, port in enumerate(ports):
            servers.append(Proc.start(
                [*LLMGW, "server", "--insecure", "--http-port", str(port), "--agent-port", "0",
                 "--data-dir", str(tmp_path / f"d{i}"), *LEASE], log_path=tmp_path / f"server{i}.log",
                env={**os.environ, "LLMGW_DATABASE": url}))
        for proc, port in zip(servers, ports, strict=True):
            proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60)

        def leaders() -> list[str]:
            docs = [httpx.get(f"http://127.0.0.1:{p}/api/v1/controlplanes", timeout=5).json() for p in ports]
            return [cp["id"] for d in docs for cp in d["controlplanes"] if cp["role"] == "leader"]

        wait_for(lambda: len(leaders()) == 3 and len(set(leaders())) == 1, timeout=20, what="one leader")
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                versions = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
        finally:
            engine.dispose()
        assert versions == [_head_revision()]
        for i in range(3):
            assert "already exists" not in (tmp_path / f"server{i}.log").read_text(errors="replace")
    finally:
        for proc in servers:
            proc.stop(timeout=10)


def test_a_second_server_is_refused_without_the_cluster_ca(tmp_path: Path, pg: Postgres) -> None:
    """`llmgw init` against a database that has a cluster's users, without --ca-from, is refused saying how."""
    url = pg.create_database(f"ha{next(_names)}")
    first = subprocess.run([*LLMGW, "init", "--data-dir", str(tmp_path / "a"), "--database",
                            url], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([*LLMGW, "init", "--data-dir", str(tmp_path / "b"), "--database",
                             url], capture_output=True, text=True, timeout=60)
    assert second.returncode != 0 and "--ca-from" in second.stderr + second.stdout
    assert not (tmp_path / "b" / "pki").exists()
    third = subprocess.run([*LLMGW, "init", "--data-dir", str(tmp_path / "b"), "--database",
                            url, "--ca-from", str(tmp_path / "a" / "pki")], capture_output=True, text=True, timeout=60)
    assert third.returncode == 0, third.stderr
    assert "users are kept" in third.stdout and "password" not in third.stdout
    assert (tmp_path / "b" / "pki" / "ca.crt").read_bytes() == (tmp_path / "a" / "pki" / "ca.crt").read_bytes()


def _head_revision() -> str:
    """The newest migration's revision: the one every server must have brought the database to."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg).get_current_head() or ""
