"""The rolling upgrade from the previous release to this tree, under traffic, in the README's order.

The previous release (``tests/upgrade/PREVIOUS``) and the working tree are each built into a venv of their own
(``llmgw.testing.releases``). On one PostgreSQL: control planes A (leads) and B (stands by), two agents (one
per node, each with its state directory), a standalone router following both control planes, a sim model of 2
replicas and a llama.cpp model of 1 (the tiny GGUF), all of the previous release. Then, with the real
``openai`` client sending chat completions (streamed and not) to both models through a router the whole time:

0. (first, as the README's order has it) `llmgw backup` of the previous release, while the cluster serves
   (restoring is tests/e2e/test_backup_restore.py's and tests/integration/test_backup_*.py's);
1. control plane B (the standby) is stopped and started on this tree: it stands by again (no migration);
2. A (the leader) is stopped with SIGTERM: B takes over, both agents register with it (previous-release
   agents with a new control plane: the policy allows N-1), then A starts on this tree and stands by;
3. each agent is stopped with SIGTERM and started on this tree on the same state directory: it adopts the
   engines (same pids, none restarted) and its node is Ready;
4. a second router on this tree takes the traffic (the clients move to it between requests), then the old
   one is stopped with SIGTERM while two long streams are open on it: they must end whole (its graceful drain).

Asserted: not one failed request, and some served of each model, in every phase; the same engine processes;
every node Ready at this tree's version; each version change in the events (``AgentVersionChanged`` per node,
``ControlPlaneVersionChanged`` when B took the lease at the new version); the database at this tree's migration
head; ``llmgw version`` naming this tree's version for the CLI, both control planes, both agents and the
routers. Each step's time and the requests served during it are printed (``-s``), for bench/README.md.

The other way: an agent and a router of this tree against a control plane of the previous release only refuse
it themselves (the old control plane cannot know of a newer protocol), with ``core.skew``'s sentence in their
logs; the node never becomes Ready there.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory

from llmgw.control.store.store import MIGRATIONS
from llmgw.core import skew
from llmgw.testing import releases, tiny_gguf
from llmgw.testing.openaitraffic import HeldStreams, Traffic
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import wait_for
from llmgw.testing.system import sim_model
from llmgw.testing.upgrade import Agent, Api, ControlPlane, Router, kill_engines, write_secret

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
NODES = ("node1", "node2")


@pytest.fixture(scope="module")
def builds() -> tuple[releases.Release, releases.Release]:
    """(the previous release, this tree), each in a venv of its own (cached: a second run takes a second)."""
    cache = releases.default_cache_root(REPO)
    previous = releases.build(REPO, releases.previous_commit(REPO), cache)
    head = releases.build(REPO, None, cache)
    assert previous.version != head.version, (previous.version, head.version)
    return previous, head


@pytest.fixture(scope="module")
def pg() -> Iterator[Postgres]:
    with Postgres() as server:
        yield server


def until(predicate: Callable[[], object], *, timeout: float, what: str,
          show: Callable[[], object] | None = None) -> object:
    """``wait_for`` at a pace a loaded 2-core machine's control planes do not notice (each poll is a REST call);
    on a timeout, what ``show`` returns then is in the message."""
    try:
        return wait_for(predicate, timeout=timeout, interval=0.25, what=what)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; last: {show() if show else '-'}") from None


def llama_model(name: str, gguf: Path) -> dict[str, object]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
            "spec": {"engine": "llamacpp", "source": f"file://{gguf}", "served_name": name,
                     "engine_args": ["--ctx-size", "512", "--parallel", "2"], "startup_timeout": "90s"}}


def adopted(api: Api, cp: ControlPlane, agent: Agent, version: str, pids: set[int]) -> bool:
    """Whether ``agent``'s node is Ready at ``version`` on ``cp`` with every shard Ready in one of ``pids`` (the
    engines the previous agent left: adopted, not started again). (A shard's ``adopted`` mark lasts only while
    the new agent checks the engine, so the pids are what tell.)"""
    node = api.nodes(cp).get(agent.node)
    if node is None or node["status"] != "Ready" or node["agent_version"] != version:
        return False
    shards = node["shard_states"]
    return bool(shards) and all(s["pid"] in pids and s["state"] == "Ready" for s in shards)


def schema_head() -> str:
    """This tree's newest migration: where its control planes leave the database."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg).get_current_head() or ""


def schema_revisions(database: str) -> list[str]:
    """The revisions the database's ``alembic_version`` holds."""
    engine = sa.create_engine(database)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all())
    finally:
        engine.dispose()


def print_measures(engines: dict[str, set[int]], took: dict[str, float], traffic: Traffic) -> None:
    """Each step's time and each phase's requests (``pytest -s``), for bench/README.md."""
    print(f"\nengine processes per node: { {n: len(p) for n, p in engines.items()} }")
    print("measured (one run):")
    for step, seconds in took.items():
        print(f"  {step}: {seconds:.1f} s")
    for name, tally in traffic.tallies.items():
        print(f"  phase {name!r}: {tally.seconds:.1f} s, {tally.ok} served ({tally.streamed} streamed; "
              f"{tally.by_model['sim']} sim, {tally.by_model['tiny']} llama.cpp; slowest {tally.slowest_s:.2f} s), "
              f"{len(tally.failures)} failed")


@pytest.mark.timeout(420)
def test_a_rolling_upgrade_under_traffic_fails_no_request_and_restarts_no_engine(
        tmp_path: Path, pg: Postgres, builds: tuple[releases.Release, releases.Release]) -> None:
    prev, head = builds
    database = pg.create_database("rolling")
    a = ControlPlane("cp-a", tmp_path, database)
    b = ControlPlane("cp-b", tmp_path, database, ca_from=a.data_dir / "pki")
    models = tmp_path / "models"
    models.mkdir()
    gguf = tiny_gguf.write_tiny_llama_gguf(models / "tiny.gguf")
    os.chmod(models, 0o755)  # engines run as uids of their own and read the model from here
    agents = [Agent(n, tmp_path, model_dirs=[models]) for n in NODES]
    token_file = tmp_path / "router.token"
    # The old router as `llmgw router` runs by default here (a hub and a worker per core), so its drain on SIGTERM
    # is the hub's over its workers; the new one a single process.
    old_router = Router("edge-old", tmp_path, token_file, workers=2)
    new_router = Router("edge-new", tmp_path, token_file)
    api = Api()
    took: dict[str, float] = {}
    try:
        # -- the cluster, all of the previous release ----------------------------------------------------------
        password = a.init(prev)
        a.start(prev)
        api.login(a, password)
        b.init(prev)
        b.start(prev)
        until(lambda: api.leads(a, b, prev.version), timeout=30, what="A leads, B stands by, both previous")
        for agent in agents:
            made = api.post(a, "/api/v1/tokens", {"node": agent.node})
            agent.join(prev, a, made["token"], made["ca_hash"])
            agent.start(prev, [a, b])
        until(lambda: all(api.nodes(a).get(n, {}).get("status") == "Ready" for n in NODES), timeout=60,
              what="both nodes Ready")
        write_secret(token_file, api.post(a, "/api/v1/routers", {"name": "edge"})["token"])
        old_router.start(prev, [a, b])
        api.post(a, "/api/v1/models", sim_model("sim", replicas=2))
        api.post(a, "/api/v1/models", llama_model("tiny", gguf))
        for name in ("sim", "tiny"):
            until(lambda n=name: api.model_ready(a, n), timeout=150, what=f"{name} Ready",  # type: ignore[misc]
                  show=lambda n=name: api.get(a, f"/api/v1/models/{n}")["status"])  # type: ignore[misc]
        old_router.wait_serving("sim", "tiny")
        engines = {agent.node: agent.engine_pids() for agent in agents}
        assert sum(len(p) for p in engines.values()) >= 3, engines  # 2 sim replicas and the llama.cpp one
        assert all(engines.values()), f"a node runs no engine: its agent's upgrade would adopt nothing: {engines}"

        with Traffic(old_router.url, ["sim", "tiny"], extra_body={"tiny": {"ignore_eos": True}}) as traffic:
            traffic.wait_served(8)

            # 0. The README's first step: a backup, with the previous release's own `llmgw backup` (pg_dump of the
            # store, the CA, all sealed), taken while it serves.
            traffic.phase("backup")
            started = time.monotonic()
            backup = tmp_path / "before-upgrade.llmgwbak"
            prev.run("backup", str(backup), "--data-dir", str(a.data_dir),
                     env={"LLMGW_BACKUP_PASSPHRASE": "rolling upgrade test"}, timeout=120)
            assert oct(backup.stat().st_mode & 0o777) == "0o600" and backup.stat().st_size > 1024
            took["backup"] = time.monotonic() - started
            traffic.wait_served(4)

            # 1. The standby control plane.
            traffic.phase("control plane B (standby)")
            started = time.monotonic()
            assert b.stop() == 0
            b.start(head)
            until(lambda: api.leads(a, b) and api.roles(a)[b.url][1] == head.version, timeout=60,
                  what="B back as a standby at HEAD")
            took["control plane B (standby)"] = time.monotonic() - started
            traffic.wait_served(4)

            # 2. The leader: a failover to B, then A back on HEAD as the standby.
            traffic.phase("control plane A (leader)")
            started = time.monotonic()
            assert a.stop() == 0
            until(lambda: api.roles(b).get(b.url, ("", ""))[0] == "leader", timeout=30, what="B leads")
            until(lambda: all(api.nodes(b).get(n, {}).get("connected") for n in NODES), timeout=60,
                  what="both agents registered with B")
            took["failover to B"] = time.monotonic() - started
            a.start(head)
            until(lambda: api.leads(b, a, head.version), timeout=60, what="B leads, A stands by, both HEAD")
            took["control plane A (leader)"] = time.monotonic() - started
            traffic.wait_served(4)

            # 3. Each agent: SIGTERM, and this tree's agent on the same state directory adopts the engines.
            for agent in agents:
                traffic.phase(f"agent {agent.node}")
                before = agent.engine_pids()
                started = time.monotonic()
                assert agent.stop() == 0
                assert agent.engine_pids() == before, f"engines of {agent.node} ended with their agent"
                agent.start(head, [b, a])
                until(lambda ag=agent, p=before: adopted(api, b, ag, head.version, p), timeout=60,  # type: ignore[misc]
                      what=f"{agent.node} Ready at HEAD, its engines adopted {sorted(before)}",
                      show=lambda ag=agent: api.nodes(b).get(ag.node))  # type: ignore[misc]
                took[f"agent {agent.node}"] = time.monotonic() - started
                traffic.wait_served(4)

            # 4. The router: a second one on HEAD takes the traffic; the old one drains on SIGTERM.
            traffic.phase("router")
            started = time.monotonic()
            new_router.start(head, [b, a])
            new_router.wait_serving("sim", "tiny")
            held = HeldStreams(old_router.url, "sim", n=2, max_tokens=600).start()
            held.wait_flowing()
            traffic.switch(new_router.url)
            open_at_stop = held.open
            old_exit = old_router.stop()
            drained = held.join()
            took["router"] = time.monotonic() - started
            traffic.wait_served(4)

            traffic.phase("all at HEAD")
            traffic.wait_served(8)

        # -- what the upgrade must have kept --------------------------------------------------------------------
        print_measures(engines, took, traffic)
        assert traffic.failures == [], traffic.failures[:10]
        served = {name: (t.by_model["sim"], t.by_model["tiny"]) for name, t in traffic.tallies.items()}
        assert all(sim and tiny for sim, tiny in served.values()), served  # both models, in every phase
        assert open_at_stop == 2, "the held streams had ended before the old router was stopped: nothing drained"
        assert drained == ["ok", "ok"], f"the old router cut its open streams on SIGTERM: {drained}"
        assert old_exit == 0, old_router.name
        assert {agent.node: agent.engine_pids() for agent in agents} == engines
        nodes = api.nodes(b)
        assert {n: (nodes[n]["status"], nodes[n]["agent_version"]) for n in NODES} == \
            {n: ("Ready", head.version) for n in NODES}
        for agent in agents:
            said = [e["message"] for e in api.events(b, node=agent.node) if e["reason"] == "AgentVersionChanged"]
            assert said == [f"agent {prev.version} → {head.version}"], (agent.node, said)
        b_id = api.get(b, "/api/v1/controlplanes")["self"]
        said = [e["message"] for e in api.events(b, obj=f"controlplane/{b_id}")
                if e["reason"] == "ControlPlaneVersionChanged"]
        assert said == [f"control plane {prev.version} → {head.version} ({b_id} leads now)"], said
        assert schema_revisions(database) == [schema_head()]
        said = head.run("version", "--url", b.url, env={"LLMGW_TOKEN": api.token}).stdout.splitlines()
        print("\n".join(["llmgw version:", *said]))
        parts = [line for line in said if not line.startswith("router")]
        assert len(parts) == 1 + 2 + len(NODES), said  # the CLI, two control planes, the agents
        assert all(line.split()[-1] == head.version for line in parts), said
        # The routers reporting now: the new one at HEAD (the old one's workers, stopped, may still be listed a
        # while, at the previous version, marked as differing; 0.1.0's reports carried none: "-").
        routers = {line.split()[1]: line.split()[2] for line in said if line.startswith("router ")}
        assert routers.get(new_router.name) == head.version, said
        assert set(routers.values()) <= {head.version, prev.version, "-"}, said
    finally:
        for router in (new_router, old_router):
            router.stop(timeout=5)
        for agent in agents:
            agent.stop()
        for cp in (a, b):
            cp.stop()
        kill_engines(tmp_path)


def _protocol_of(release: releases.Release) -> int:
    """The wire protocol a release's code says (0: a release before protocols, which sends none)."""
    probe = "import importlib.util as u; print(__import__('llmgw.core.skew').core.skew.PROTOCOL " \
            "if u.find_spec('llmgw.core.skew') else 0)"
    # Run from the venv, not the checkout: `python -c` puts its working directory first on sys.path.
    return int(subprocess.run(release.python_argv("-c", probe), env=release.env(), cwd=release.venv,
                              capture_output=True, text=True, check=True, timeout=60).stdout.strip())


def test_an_agent_and_a_router_newer_than_the_previous_release_control_plane_refuse_it(
        tmp_path: Path, builds: tuple[releases.Release, releases.Release]) -> None:
    """This tree's agent and router (``skew.PROTOCOL``) against a control plane of the previous release (one
    protocol older; 0.1.0 sent none): the old control plane serves them, unable to know better, and each refuses
    it itself, logging ``core.skew``'s sentence (its own version and the control plane's protocol and version).
    The agent never says it registered and its node is not Ready there; the router keeps no
    table from it. (The policy's other side, an agent and a router of the previous release under a newer
    control plane, is the rolling upgrade's failover step above: allowed, and not a request failed.)"""
    prev, head = builds
    cp = ControlPlane("cp", tmp_path, "")
    agent = Agent("node3", tmp_path)
    router = Router("new", tmp_path, tmp_path / "router.token")
    api = Api()
    try:
        password = cp.init(prev)
        cp.start(prev)
        api.login(cp, password)
        made = api.post(cp, "/api/v1/tokens", {"node": agent.node})
        agent.join(head, cp, made["token"], made["ca_hash"])
        proc = agent.start(head, [cp])
        write_secret(router.token_file, api.post(cp, "/api/v1/routers", {"name": "edge"})["token"])
        routed = router.start(head, [cp])
        theirs = _protocol_of(prev)
        for kind, p in (("agent", proc), ("router", routed)):
            sentence = skew.server_refusal(kind, theirs, prev.version if theirs else "", own_protocol=skew.PROTOCOL,
                                           own_version=head.version)
            assert head.version in sentence and f"(protocol {skew.effective(theirs)})" in sentence, sentence
            until(lambda s=sentence, q=p: s in q.log_tail(200) or q.poll() is not None,  # type: ignore[misc]
                  timeout=60, what=f"the {kind}'s refusal")
            assert sentence in p.log_tail(200), p.log_tail(200)
            assert p.poll() is None, f"the {kind} polls on (with backoff) until one side is upgraded"
        until(lambda: api.nodes(cp).get(agent.node, {}).get("status") != "Ready", timeout=30, what="node3 not Ready")
        assert "registered with" not in proc.log_tail(400), proc.log_tail(400)
        # No table taken from it: 503 (none yet), where a table without the model would answer 404.
        asked = httpx.post(f"{router.url}/v1/chat/completions", timeout=30, json={
            "model": "any", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert asked.status_code == 503, (asked.status_code, asked.text)
    finally:
        router.stop(timeout=5)
        agent.stop()
        cp.stop()
        kill_engines(tmp_path)
