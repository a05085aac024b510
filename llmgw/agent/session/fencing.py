"""Refusing a deposed leader's commands: the newest leader term seen, and which commands carry one.

Each leader's commands carry its term (the lease's fencing token): a command from a term older than the
newest seen comes from a deposed leader that woke from a pause, and is refused with an Ack saying why.
"""

from __future__ import annotations

import logging

from llmgw.agent.session.outbox import Outbox
from llmgw.api.v1 import agent_pb2 as pb

log = logging.getLogger(__name__)

#: The commands a deposed leader must not get carried out; they carry the sender's term.
FENCED = frozenset({"start_shard", "stop_shard", "drain", "remove_weights", "provision", "fabric_test",
                    "logs_request", "upgrade_agent"})


class Fence:
    """The newest leader term seen (Register's answer, every command), kept across streams, so a deposed
    leader's command is refused whichever connection it arrives on. 0: none seen yet."""

    def __init__(self) -> None:
        self.term = 0
        self._stale_logged: set[int] = set()

    def see(self, term: int) -> None:
        if term > self.term:
            if self.term:
                log.info("a control plane leads under term %d now (was %d)", term, self.term)
            self.term = term

    def stale(self, msg: pb.ControlMessage, kind: str, outbox: Outbox) -> bool:
        """Whether ``msg`` comes from a deposed leader (refused, answered, logged once per term)."""
        if not msg.term or msg.term >= self.term:
            return False  # 0: a control plane too old to send its term; acting on it is all it knows
        error = (f"refused {kind}: its term {msg.term} is older than term {self.term}, the newest this agent has "
                 f"seen (a newer control plane leads; this one was deposed and should step down); ignored")
        if msg.term not in self._stale_logged:
            self._stale_logged.add(msg.term)
            log.warning("%s (said once for term %d)", error, msg.term)
        outbox.ack(msg.seq, error=error)
        return True
