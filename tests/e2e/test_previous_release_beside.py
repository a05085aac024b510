"""The previous release's server (0.1.0, built from tests/upgrade/PREVIOUS into a venv of its own) on the
schema this release migrated, beside this release's server on one real PostgreSQL (issue 29: expand-then-contract).

This release's server migrates a fresh database and writes a model, a key and a user; 0.1.0's server starts
against the same database as a standby, then leads (this release's leader paused past its lease, then resumed
as a standby: it never stops) and reads what this release wrote, and writes a model and a key; leadership
comes back to this release, which reads what 0.1.0 wrote. Neither refuses, crashes or logs an error.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llmgw.core.version import version
from llmgw.testing import releases
from llmgw.testing.postgres import Postgres
from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import System, sim_model

REPO = Path(__file__).resolve().parents[2]
LEASE = ("--lease", "2s", "--lease-renew", "0.25s")


@pytest.fixture(scope="module")
def previous() -> releases.Release:
    return releases.build(REPO, releases.previous_commit(REPO), releases.default_cache_root(REPO))


@pytest.fixture
def pg() -> Iterator[Postgres]:
    with Postgres() as server:
        yield server


def start_previous(rel: releases.Release, s: System, ca_from: Path) -> None:
    """The release's own ``llmgw init --ca-from`` and ``llmgw server`` for ``s`` (its database in
    LLMGW_DATABASE, as a URL that may hold a password must be given)."""
    env = {"LLMGW_DATABASE": s.database}
    rel.run("init", "--data-dir", str(s.data_dir), "--ca-from", str(ca_from), env=env)
    ports = s.root / "ports.json"
    s.server = Proc.start(rel.argv("server", "--http-port", "0", "--agent-port", "0", "--join-port", "0",
                                   "--data-dir", str(s.data_dir), "--ports-file", str(ports), *LEASE),
                          log_path=s.root / "server.log", env=rel.env(env), cwd=rel.venv)
    doc = json.loads(str(wait_for(lambda: ports.exists() and ports.read_text(), timeout=60, what="0.1.0's ports")))
    s.http_port, s.agent_port = doc["http_port"], doc["agent_port"]
    s.server.wait_http(f"{s.url}/healthz", timeout=30)


def planes(s: System) -> dict[str, tuple[str, str]]:
    """Each control plane's (role, version), by id, as ``s`` answers (a standby answers this itself)."""
    return {cp["id"]: (cp["role"], cp["version"]) for cp in s.get("/api/v1/controlplanes")["controlplanes"]}


def leads(s: System) -> bool:
    doc = s.get("/api/v1/controlplanes")
    return any(cp["role"] == "leader" and cp["id"] == doc["self"] for cp in doc["controlplanes"])


def hand_over(frm: System, to: System) -> None:
    """``to`` leads and ``frm`` stands by, both running: ``frm`` paused past its lease, then resumed."""
    assert frm.server is not None
    frm.server.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: leads(to), timeout=30, what="the other control plane leads")
    finally:
        frm.server.signal(signal.SIGCONT)
    wait_for(lambda: not leads(frm) and leads(to), timeout=30, what="the paused one stands by")


def names(s: System, path: str, key: str = "name") -> list[str]:
    items: list[dict[str, Any]] = s.get(path)["items"]
    return sorted(i["metadata"]["name"] if key == "metadata" else i[key] for i in items)


def audited(s: System, *objects: str) -> None:
    """Waits until the audit log holds an entry for each of ``objects``: the leader writes it off the request,
    and a leader paused with it queued would find its write fenced when it wakes."""
    wait_for(lambda: set(objects) <= {e["object"] for e in s.get("/api/v1/audit")["items"]}, timeout=30,
             what=f"audit entries for {', '.join(objects)}")


def problems(log: Path) -> list[str]:
    """Error lines of a server's log, but what a deposed leader logs by design: "no longer leads", and (0.2.0
    logs it as an ERROR with a traceback) a queued write the lease's fencing refused, or whose session this
    release ended when it took the lease from the stopped leader: the write's whole traceback (its chained
    exceptions included, up to the next log line) when it ends in the ``Fenced`` sentence or in PostgreSQL's
    "terminating connection due to administrator command"."""
    lines = log.read_text(errors="replace").splitlines()
    by_design: set[int] = set()
    for i, line in enumerate(lines):
        if "a queued store write failed" in line:
            end = next((j for j in range(i + 1, len(lines)) if re.match(r"\d{4}-\d\d-\d\d ", lines[j])), len(lines))
            if any("Fenced:" in t or "terminating connection due to administrator command" in t
                   for t in lines[i + 1:end]):
                by_design.update(range(i, end))
    return [line for i, line in enumerate(lines)
            if i not in by_design and "no longer leads" not in line
            and (" ERROR " in line or " CRITICAL " in line or line.startswith(("Traceback", "error:")))]


def test_the_previous_release_runs_beside_this_one_on_its_schema(
        tmp_path: Path, pg: Postgres, previous: releases.Release) -> None:
    assert previous.version != version()
    url = pg.create_database("beside")
    head = System(tmp_path / "head", database=url, server_args=LEASE)
    prev = System(tmp_path / "prev", database=url)
    try:
        # This release migrates the fresh database and records the floor, then writes.
        head.start_server()
        engine = sa.create_engine(url)
        with engine.connect() as c:
            assert c.execute(sa.text("select version_num from alembic_version")).scalar_one() == "0016"  # 0016: batches
            assert dict(c.execute(sa.text("select key, value from settings where key like 'schema_%'")).all()) == {
                "schema_floor": "0015", "schema_written_by": version()}
        engine.dispose()
        head.apply(sim_model("from-head", replicas=2))
        # A kind: Adapter is stored in its base's manifest (no migration): the previous release reads it as one of
        # the model's spec.adapters.
        added = head.request("POST", "/api/v1/adapters", json={
            "apiVersion": "llmgw/v1", "kind": "Adapter", "metadata": {"name": "from-head-sql"},
            "spec": {"base": "from-head", "source": "/srv/loras/sql"}})
        assert added.status_code == 201, added.text
        assert head.request("POST", "/api/v1/keys", json={"name": "head-key"}).status_code == 201
        assert head.request("POST", "/api/v1/users", json={"name": "ops", "role": "viewer"}).status_code == 201
        audited(head, "model/from-head", "user/ops")

        # 0.1.0 starts on that schema beside it, as a standby.
        prev.token = head.token
        start_previous(previous, prev, head.data_dir / "pki")
        wait_for(lambda: sorted(planes(prev).values()) == [("leader", version()), ("standby", previous.version)],
                 timeout=30, what="this release leads, 0.1.0 stands by")

        # 0.1.0 leads, this release stands by (still running): 0.1.0 reads what this release wrote, and writes.
        hand_over(head, prev)
        doc = prev.get("/api/v1/models/from-head")
        assert doc["metadata"]["name"] == "from-head" and doc["spec"]["replicas"] == 2
        assert [a["name"] for a in doc["spec"]["adapters"]] == ["from-head-sql"]
        assert names(prev, "/api/v1/keys") == ["head-key"]
        assert "ops" in names(prev, "/api/v1/users")
        prev.apply(sim_model("from-previous", replicas=3))
        made = prev.request("POST", "/api/v1/keys", json={"name": "previous-key"})
        assert made.status_code == 201, made.text
        audited(prev, "model/from-previous", f"key/{made.json()['id']}")

        # This release leads again and reads what 0.1.0 wrote; 0.1.0 stands by, still running.
        hand_over(prev, head)
        assert names(head, "/api/v1/models", "metadata") == ["from-head", "from-previous"]
        assert head.get("/api/v1/models/from-previous")["spec"]["replicas"] == 3
        assert names(head, "/api/v1/keys") == ["head-key", "previous-key"]
        assert [(a["name"], a["applied"]) for a in head.get("/api/v1/adapters")["items"]] == [("from-head-sql",
                                                                                              "Adapter")]
        assert {"model/from-head", "model/from-previous"} <= {e["object"] for e in head.get("/api/v1/audit")["items"]}
        head.apply(sim_model("after", replicas=1))
        assert names(prev, "/api/v1/models", "metadata") == ["after", "from-head", "from-previous"]  # forwarded

        assert prev.server is not None and prev.server.popen.poll() is None
        assert problems(prev.root / "server.log") == []
        assert problems(head.root / "server.log") == []
        assert "schema" not in (head.root / "server.log").read_text(errors="replace")  # no floor warning: known
    finally:
        codes = (prev.server.stop(timeout=15) if prev.server else None,
                 head.server.stop(timeout=15) if head.server else None)
        prev.close()
        head.close()
    assert codes == (0, 0)
