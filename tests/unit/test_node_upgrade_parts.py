"""`llmgw node upgrade`'s parts on plain data: the one version check, the control plane's attempt and its health
gate (a clock of the test's, no waiting), the agent's refusals, the re-exec command line, and the REST refusals
(the real app, in process, over a real Link)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.agent import selfupgrade
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.control import events as ev
from llmgw.control import upgrades
from llmgw.control.agentsvc.link import Link
from llmgw.control.auth import Auth, principals
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.reconcile import engines as provisioning
from llmgw.control.state import NodeView
from llmgw.control.store.store import Store, StoredNode
from llmgw.core.agentupgrade import State, UpgradeRequest, UpgradeStatus, release_key, version_problem
from llmgw.core.inventory import Inventory
from llmgw.core.shards import ShardState, ShardStatus


@pytest.mark.parametrize("good", ["0.2.1", "1.0.0rc1", "0.2.0.post1", "0.3.0.dev2", "2!1.0", "10.20.30", "1.0a1"])
def test_a_release_in_normal_form_passes(good: str) -> None:
    assert version_problem(good) == ""


@pytest.mark.parametrize("bad", ["", "../0.2.0", "0.2.0/../../x", "0.2.0+local", "v0.2.0", ">=0.2", "0.2.0 ",
                                 "0.2.0\n", "0.2.0;rm -rf /", "0.2.0 --index-url http://evil/", ".", "..",
                                 "0.2.0-post1", "01.2", "1." + "0" * 70, "0.2.0,<1", "llmgw==0.2.0", "0.2.*"])
def test_anything_else_is_refused_saying_what_a_release_looks_like(bad: str) -> None:
    said = version_problem(bad)
    assert said and ("0.2.1" in said)


def test_releases_order_as_pep_440_says() -> None:
    ordered = ["0.2.0.dev1", "0.2.0a1.dev2", "0.2.0a1", "0.2.0b2", "0.2.0rc1", "0.2.0", "0.2.0.post1.dev1",
               "0.2.0.post1", "0.2.1", "0.10.0", "1!0.1"]
    assert sorted(reversed(ordered), key=release_key) == ordered
    assert release_key("0.2") == release_key("0.2.0")
    with pytest.raises(ValueError):
        release_key("dev")


def test_an_agent_started_older_resumes_the_release_it_was_upgraded_to(tmp_path: Path) -> None:
    argv = ["/x/llmgw/__main__.py", "agent", "--server", "h:1"]
    assert selfupgrade.resume_python(tmp_path, "0.2.0", argv) is None  # never upgraded
    venv = selfupgrade.venv_dir(tmp_path, "0.2.1")
    (venv / "bin").mkdir(parents=True)
    selfupgrade.remember(tmp_path, "0.2.1")
    assert selfupgrade.resume_python(tmp_path, "0.2.0", argv) is None  # not complete: no marker
    (venv / selfupgrade.MARKER).write_text('{"version": "0.2.1", "state": "ready"}')
    assert selfupgrade.resume_python(tmp_path, "0.2.0", argv) is None  # no python in it
    (venv / "bin" / "python").write_text("")
    assert selfupgrade.resume_python(tmp_path, "0.2.0", argv) == venv / "bin" / "python"
    assert selfupgrade.resume_python(tmp_path, "0.2.1", argv) is None  # runs it already
    assert selfupgrade.resume_python(tmp_path, "0.3.0", argv) is None  # a newer one was installed: it runs
    assert selfupgrade.resume_python(tmp_path, "dev", argv) is None  # a checkout is left as started
    assert selfupgrade.resume_python(tmp_path, "0.2.0", ["/x/llmgw", "up"]) is None
    (tmp_path / "llmgw" / selfupgrade.CURRENT).write_text('{"version": "../../bin"}')
    assert selfupgrade.resume_python(tmp_path, "0.2.0", argv) is None


class RecordingLink:
    """What the control plane sent the agent (the ``upgrade_agent`` calls), as a real Link's caller sees them."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def upgrade_agent(self, **kw: Any) -> None:
        self.sent.append(kw)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ups() -> tuple[upgrades.Upgrades, Clock, list[ev.Event]]:
    clock, recorded = Clock(), []  # type: ignore[var-annotated]
    return upgrades.Upgrades(clock=clock, record=recorded.append), clock, recorded


def test_an_attempt_goes_installing_restarting_registered_then_done_once_the_node_is_ready() -> None:
    ups, clock, recorded = _ups()
    link = RecordingLink()
    a = ups.start("n1", link, version="0.2.1", from_version="0.2.0", index_url="http://idx/", find_links=True)
    assert link.sent == [{"id": a.id, "version": "0.2.1", "index_url": "http://idx/", "find_links": True}]
    assert ups.under_way("n1") is a and a.state == upgrades.SENT
    ups.reported("n1", UpgradeStatus(a.id, "0.2.1", State.INSTALLING, "downloading"))
    assert (a.state, a.message) == (upgrades.INSTALLING, "downloading")
    assert a.words() == "upgrading to 0.2.1: installing (downloading)"
    ups.reported("n1", UpgradeStatus("another", "0.2.1", State.FAILED, "old news"))  # not this attempt: ignored
    assert a.state == upgrades.INSTALLING
    ups.reported("n1", UpgradeStatus(a.id, "0.2.1", State.RESTARTING, "re-executing"))
    ups.registered("n1", "0.2.1")
    assert a.state == upgrades.REGISTERED
    # The gate: a shard still starting holds it; Ready lets it through.
    assert ups.progress("n1", ready=lambda: "s1 is Starting").state == upgrades.REGISTERED  # type: ignore[union-attr]
    assert "s1 is Starting" in a.message
    ups.step(lambda node: "" if node == "n1" else "unknown")  # the control loop's pass moves it on unread
    assert a.state == upgrades.DONE
    assert ups.under_way("n1") is None
    assert [e.reason for e in recorded] == ["NodeUpgrading", "NodeUpgraded"]
    assert all(e.object == "node/n1" and e.node == "n1" for e in recorded)


def test_an_attempt_fails_when_the_agent_says_so_comes_back_old_or_misses_a_deadline() -> None:
    ups, clock, recorded = _ups()
    link = RecordingLink()
    a = ups.start("n1", link, version="0.2.1", from_version="0.2.0", index_url="i", find_links=False)
    ups.reported("n1", UpgradeStatus(a.id, "0.2.1", State.FAILED, "pip install exited 1: ERROR: no llmgw",
                                     tuple(f"line {i}" for i in range(30))))
    assert a.state == upgrades.FAILED and "no llmgw" in a.message and a.last_output[-1] == "line 29"
    assert len(a.last_output) == 20 and a.words() == "upgrade to 0.2.1 failed"
    assert recorded[-1].reason == "NodeUpgradeFailed" and recorded[-1].kind == ev.WARNING

    b = ups.start("n1", link, version="0.2.1", from_version="0.2.0", index_url="i", find_links=False)
    ups.reported("n1", UpgradeStatus(b.id, "0.2.1", State.RESTARTING, ""))
    ups.registered("n1", "0.2.0")
    assert b.state == upgrades.FAILED and "came back as llmgw 0.2.0, not 0.2.1" in b.message

    c = ups.start("n1", link, version="0.2.1", from_version="0.2.0", index_url="i", find_links=False)
    clock.now += upgrades.ANSWER_S + 1  # an agent older than 0.2.0 ignores the message
    assert ups.progress("n1", ready=lambda: "").state == upgrades.FAILED  # type: ignore[union-attr]
    assert "older than llmgw 0.2.0 cannot upgrade itself" in c.message

    d = ups.start("n1", link, version="0.2.1", from_version="0.2.0", index_url="i", find_links=False,
                  ready_timeout_s=60)
    ups.reported("n1", UpgradeStatus(d.id, "0.2.1", State.RESTARTING, ""))
    ups.registered("n1", "0.2.1")
    clock.now += 61
    assert ups.progress("n1", ready=lambda: "s1 is Starting").state == upgrades.FAILED  # type: ignore[union-attr]
    assert "not Ready within 60 s" in d.message and "s1 is Starting" in d.message
    ups.clear()  # a step-down: the next leader starts without them
    assert ups.progress("n1", ready=lambda: "") is None


def test_the_gate_reads_every_live_shard() -> None:
    view = NodeView("n1", Inventory(1, 1, 1), connected=True, shards={
        "a": ShardStatus("a", "r1", ShardState.READY), "b": ShardStatus("b", "r2", ShardState.STARTING),
        "c": ShardStatus("c", "r3", ShardState.STOPPED)})
    assert upgrades.not_ready(view, True) == "b is Starting"
    assert upgrades.not_ready(view, False) == "the node is not connected"
    ready = dataclasses.replace(view, shards={"a": view.shards["a"], "c": view.shards["c"]})
    assert upgrades.not_ready(ready, True) == ""


def _upgrader(tmp_path: Path, argv: list[str]) -> selfupgrade.SelfUpgrade:
    return selfupgrade.SelfUpgrade(tmp_path, running_version="0.2.0", restart=lambda _p: None, argv=argv)


def test_the_agent_refuses_at_once_saying_why() -> None:
    up = _upgrader(Path("/nonexistent"), ["/x/llmgw", "agent", "--server", "h:1"])
    req = UpgradeRequest("a1", "0.2.1", "http://idx/", True)
    assert up.refusal(req) == ""
    assert "0.2.1" in up.refusal(dataclasses.replace(req, version="../../etc"))
    assert up.refusal(dataclasses.replace(req, index_url="")) == selfupgrade.NO_INDEX
    assert "--engine-index" in selfupgrade.NO_INDEX
    assert "already runs llmgw 0.2.0" in up.refusal(dataclasses.replace(req, version="0.2.0"))
    inside_up = _upgrader(Path("/nonexistent"), ["/x/llmgw", "up"])
    assert "its own `llmgw agent` process" in inside_up.refusal(req)
    said: list[UpgradeStatus] = []

    async def twice() -> None:
        up.begin(dataclasses.replace(req, version="0.2.0"), said.append)  # refused: nothing started
        assert up._task is None

    asyncio.run(twice())
    assert [(s.state, s.id) for s in said] == [(State.FAILED, "a1")]


def test_the_new_agent_runs_isolated_with_the_same_arguments() -> None:
    argv = ["/usr/lib/python3/llmgw/__main__.py", "agent", "join", "--server", "h:1", "--node-id", "n1"]
    assert selfupgrade.exec_argv(Path("/s/llmgw/0.2.1/bin/python"), argv) == [
        "/s/llmgw/0.2.1/bin/python", "-I", "-m", "llmgw", "agent", "join", "--server", "h:1", "--node-id", "n1"]


def test_the_permission_is_an_admins() -> None:
    need = principals.required("POST", "/api/v1/nodes/n1/upgrade")
    assert need is not None and need.role == principals.ADMIN
    assert principals.required("GET", "/api/v1/nodes/n1/upgrade").role == principals.VIEWER  # type: ignore[union-attr]


def test_the_rest_refusals_name_what_to_do(tmp_path: Path) -> None:
    store = Store.open(tmp_path)
    cluster = Cluster(store)
    app = create_api(store, cluster, auth=Auth.insecure())

    async def go() -> None:
        node = StoredNode(id="n1", hostname="n1", mgmt_addr="127.0.0.1", agent_version="0.2.0",
                          inventory=Inventory(1, 1, 1), labels={}, first_seen=1.0, last_seen=1.0)
        store.upsert_node(node)
        link = Link("n1")
        cluster.node_registered(node, [], link)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            async def post(path: str, body: dict[str, Any]) -> tuple[int, str]:
                r = await c.post(path, json=body)
                return r.status_code, r.text

            assert (await post("/api/v1/nodes/n1/upgrade", {"version": "../x"}))[0] == 400
            code, text = await post("/api/v1/nodes/nope/upgrade", {"version": "0.2.1"})
            assert code == 404 and "llmgw get nodes" in text
            code, text = await post("/api/v1/nodes/n1/upgrade", {"version": "0.2.1"})
            assert code == 400 and "--engine-index URL" in text
            code, text = await post("/api/v1/nodes/n1/upgrade", {"version": "0.2.0"})
            assert code == 409 and "already runs llmgw 0.2.0" in text
            code, text = await post("/api/v1/nodes/n1/upgrade", {"version": "0.2.0", "skip_if_current": True})
            assert code == 200 and '"state":"done"' in text
            cluster.engine_settings = provisioning.EngineSettings(index_url="http://idx/", find_links=True)
            code, text = await post("/api/v1/nodes/n1/upgrade", {"version": "0.2.1"})
            assert code == 200, text
            sent = [m for m in _drain(link) if m.WhichOneof("body") == "upgrade_agent"]
            assert [(m.upgrade_agent.version, m.upgrade_agent.index_url, m.upgrade_agent.find_links)
                    for m in sent] == [("0.2.1", "http://idx/", True)]
            code, text = await post("/api/v1/nodes/n1/upgrade", {"version": "0.2.1"})
            assert code == 409 and "being upgraded to 0.2.1 already" in text
            got = (await c.get("/api/v1/nodes/n1")).json()
            assert got["upgrade"]["summary"].startswith("upgrading to 0.2.1: sent")

    try:
        asyncio.run(go())
    finally:
        store.close()


def _drain(link: Link) -> list[pb.ControlMessage]:
    out = []
    while not link.queue.empty():
        m = link.queue.get_nowait()
        if m is not None:
            out.append(m)
    return out
