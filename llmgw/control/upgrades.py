"""Agents' upgrades (issue 29, `llmgw node upgrade`): what was asked of each node, and how far it got.

``start`` sends a node's agent an ``UpgradeAgent`` (the version, the cluster's engine index) and records the
attempt; the agent answers with ``UpgradeStatus`` messages (``reported``: installing, restarting, failed) and, once
it re-executed into the new llmgw, registers again (``registered``). ``progress`` (each control-loop pass's
``step``, and each read) then applies the health gate:
the attempt is ``done`` once the node is connected with ``agent_version`` == V and every shard it reports is
Ready again, and ``failed`` when an agent says so, comes back with another version, or a deadline passes (no
answer within ``ANSWER_S``: an agent older than 0.2.0 ignores the message; not Ready within the attempt's
``ready_timeout_s`` of its restart).

Held in memory on the leader, with an event for each step (``NodeUpgrading``, ``NodeUpgraded``,
``NodeUpgradeFailed``, kept in the events table, which 0.1.0 reads as any other event): no store table, no
migration. A new leader knows no attempt under way (the CLI then says the attempt is unknown; the events stay).
One node at a time is the caller's order (the CLI's ``node upgrade --all``): ``start`` refuses a second attempt
on a node with one under way.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from llmgw.control import events as ev
from llmgw.control.state import NodeView
from llmgw.core.agentupgrade import State, UpgradeStatus
from llmgw.core.shards import ShardState

log = logging.getLogger(__name__)

#: How long an agent has to say it began (its first UpgradeStatus).
ANSWER_S = 30.0
#: How long a node has, after its agent said RESTARTING, to register with the new version with its shards Ready.
READY_TIMEOUT_S = 300.0
#: How long an install may take before the attempt is given up (pip's own timeout is the agent's; this bounds
#: an agent that went silent mid-install without its stream ending).
INSTALL_TIMEOUT_S = 1800.0

SENT, INSTALLING, RESTARTING, REGISTERED, DONE, FAILED = ("sent", "installing", "restarting", "registered", "done",
                                                          "failed")
ENDED = (DONE, FAILED)


def not_ready(view: NodeView | None, connected: bool) -> str:
    """Why the node is not Ready for the health gate ("" when it is: connected, every live shard Ready)."""
    if view is None or not connected:
        return "the node is not connected"
    waiting = sorted(f"{s.shard_id} is {s.state.value}" for s in view.shards.values()
                     if s.state in ShardState.live() and s.state is not ShardState.READY)
    return ", ".join(waiting[:3]) + (f" and {len(waiting) - 3} more" if len(waiting) > 3 else "")


class UpgradeLink(Protocol):
    def upgrade_agent(self, *, id: str, version: str, index_url: str, find_links: bool) -> None: ...


@dataclasses.dataclass(slots=True)
class Attempt:
    """One node's upgrade: to ``version`` from ``from_version``; ``state`` one of the names above."""

    id: str
    node: str
    version: str
    from_version: str
    state: str
    message: str
    started: float
    updated: float
    ready_timeout_s: float
    last_output: tuple[str, ...] = ()
    #: When the current phase must end by (0: no deadline).
    deadline: float = 0.0

    def doc(self) -> dict[str, Any]:
        return {"id": self.id, "node": self.node, "version": self.version, "from_version": self.from_version,
                "state": self.state, "message": self.message, "last_output": list(self.last_output),
                "started": self.started, "updated": self.updated}

    def words(self) -> str:
        """What ``llmgw get nodes`` shows: "upgrading to 0.2.1: installing (downloading)"."""
        if self.state == FAILED:
            return f"upgrade to {self.version} failed"
        if self.state == DONE:
            return f"upgraded to {self.version}"
        return f"upgrading to {self.version}: {self.state}" + (f" ({self.message})" if self.message else "")


class Upgrades:
    """The attempts, by node (the last one of each node, ended or not)."""

    def __init__(self, *, clock: Callable[[], float], record: Callable[[ev.Event], None]) -> None:
        self._clock, self._record = clock, record
        self._by_node: dict[str, Attempt] = {}

    def clear(self) -> None:
        """Stepping down: the attempts are the leader's, and the next leader starts without them."""
        self._by_node.clear()

    def under_way(self, node_id: str) -> Attempt | None:
        a = self._by_node.get(node_id)
        return a if a is not None and a.state not in ENDED else None

    def start(self, node_id: str, link: UpgradeLink, *, version: str, from_version: str, index_url: str,
              find_links: bool, ready_timeout_s: float = READY_TIMEOUT_S) -> Attempt:
        """Sends the upgrade (the caller checked the node, the version and the index) and records the attempt."""
        now = self._clock()
        a = Attempt(uuid.uuid4().hex[:12], node_id, version, from_version, SENT, "sent to the agent", now, now,
                    ready_timeout_s, deadline=now + ANSWER_S)
        self._by_node[node_id] = a
        link.upgrade_agent(id=a.id, version=version, index_url=index_url, find_links=find_links)
        log.info("upgrading node %s's agent from llmgw %s to %s (attempt %s, index %s)", node_id, from_version,
                 version, a.id, index_url)
        self._event(a, ev.NORMAL, "NodeUpgrading", f"upgrading its agent from llmgw {from_version or '?'} to "
                                                   f"{version} (attempt {a.id})")
        return a

    def reported(self, node_id: str, st: UpgradeStatus) -> None:
        """The agent's UpgradeStatus; one about another attempt (an older one) is logged and ignored."""
        a = self._by_node.get(node_id)
        if a is None or a.id != st.id or a.state in ENDED:
            log.info("node %s reports upgrade %s (%s: %s), which is not the attempt under way; ignored", node_id,
                     st.id[:40], st.state.value, st.message[:200])
            return
        now = self._clock()
        a.updated, a.message = now, st.message[:500]
        if st.state is State.FAILED:
            a.last_output = tuple(line[:500] for line in st.last_output[-20:])
            self._fail(a, st.message[:500] or "the agent gave no reason")
        elif st.state is State.RESTARTING:
            a.state, a.deadline = RESTARTING, now + a.ready_timeout_s
        else:
            a.state, a.deadline = INSTALLING, a.started + INSTALL_TIMEOUT_S

    def registered(self, node_id: str, agent_version: str) -> None:
        """The node registered (a new stream): after a restart, with the new version or not."""
        a = self.under_way(node_id)
        if a is None:
            return
        if agent_version == a.version:
            now = self._clock()
            a.state, a.message, a.updated = REGISTERED, "registered with the new version; waiting for Ready", now
            a.deadline = now + a.ready_timeout_s
        elif a.state == RESTARTING:
            self._fail(a, f"the agent came back as llmgw {agent_version or '?'}, not {a.version}; see its log "
                          "(`llmgw logs NODE`)")

    def step(self, not_ready: Callable[[str], str]) -> None:
        """Moves every attempt under way on (the control loop's pass): ``not_ready(node)`` as ``progress`` takes it."""
        for node_id in [n for n, a in self._by_node.items() if a.state not in ENDED]:
            self.progress(node_id, ready=lambda n=node_id: not_ready(n))

    def progress(self, node_id: str, *, ready: Callable[[], str]) -> Attempt | None:
        """The node's last attempt, moved on by the health gate: ``ready()`` says why the node is not Ready yet
        ("" when it is: connected, every shard Ready)."""
        a = self._by_node.get(node_id)
        if a is None or a.state in ENDED:
            return a
        now = self._clock()
        if a.state == REGISTERED:
            why = ready()
            if not why:
                a.state, a.message, a.updated = DONE, f"running llmgw {a.version}, Ready", now
                log.info("node %s's agent runs llmgw %s and the node is Ready (attempt %s)", node_id, a.version, a.id)
                self._event(a, ev.NORMAL, "NodeUpgraded", f"its agent runs llmgw {a.version} (was "
                                                          f"{a.from_version or '?'}) and the node is Ready")
                return a
            a.message = f"waiting for Ready: {why}"
        if a.deadline and now > a.deadline:
            self._fail(a, self._late(a))
        return a

    def _late(self, a: Attempt) -> str:
        if a.state == SENT:
            return (f"the agent did not answer within {ANSWER_S:.0f} s; an agent older than llmgw 0.2.0 cannot "
                    "upgrade itself: install the new llmgw on the node and restart its agent")
        if a.state == INSTALLING:
            return f"the install did not end within {INSTALL_TIMEOUT_S:.0f} s (last step: {a.message})"
        if a.state == RESTARTING:
            return (f"the agent did not come back with llmgw {a.version} within {a.ready_timeout_s:.0f} s of its "
                    "restart; see its log on the node")
        return f"the node was not Ready within {a.ready_timeout_s:.0f} s of its agent's restart ({a.message})"

    def _fail(self, a: Attempt, why: str) -> None:
        a.state, a.message, a.updated = FAILED, why, self._clock()
        log.warning("upgrading node %s's agent to llmgw %s failed: %s", a.node, a.version, why)
        self._event(a, ev.WARNING, "NodeUpgradeFailed", f"upgrading its agent to llmgw {a.version} failed: {why}")

    def _event(self, a: Attempt, kind: str, reason: str, message: str) -> None:
        self._record(ev.Event(self._clock(), kind, reason, f"node/{a.node}", message[:1000], node=a.node))
