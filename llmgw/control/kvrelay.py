"""The leader's relay of the replicas' KV block sets, from the agents' digests to the routers' long polls.

Agents send ``kvdigest.Digest``s on their streams (``AgentMessage.kv_digest``); ``KvRelay.take`` keeps
each replica's sampled set in memory (``kvdigest.Sets``: bounded per replica, cleared on a new engine
epoch, dropped with a lost digest until the next full set) and numbers every change. Routers ask
``wait(after=V)`` (``GET /api/v1/router/kv``, or in process): the changes after ``V``, held until there
are some, then ``coalesce_s`` more so that one answer carries a quarter second of every agent's digests;
a router whose version the log no longer reaches (or that is new, ``V`` = -1) gets every set whole. The
answer to one ``after`` at one version is built once, however many routers ask (``wait_json``).

Only what the route table routes is kept: ``table_changed`` (after each pass) drops a replica's set when
the replica leaves the table, and a digest is taken only from the node the table says runs the replica (an agent cannot
describe another node's engine). Nothing is stored: a standby that takes over knows nothing until each
agent registers with it, and every Register makes the agent's next digests whole sets (``agent/kvlink.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets

from llmgw.api import kvdocs, routing
from llmgw.core import kvdigest

log = logging.getLogger(__name__)

#: How long a router's poll is held after the first change, so one answer batches many digests.
COALESCE_S = 0.25
#: Sets kept for replicas the table does not route (yet): a bound on what agents can make the leader hold.
MAX_UNROUTED = 1024


class KvRelay:
    def __init__(self, *, coalesce_s: float = COALESCE_S, log_size: int = 16_384) -> None:
        self.sets = kvdigest.Sets(log_size=log_size)
        #: Names this relay's versions: a router that read another's (a failover) is answered a reset.
        self.origin = secrets.token_hex(8)
        self._coalesce_s = coalesce_s
        self._changed = asyncio.Event()
        #: replica id -> the node the table says runs it (None: no table read yet: every digest is taken).
        self._nodes: dict[str, str] | None = None
        self._table_version = -1
        self._routed: set[str] = set()  # replicas a table has routed, while it does
        self._docs: dict[int, tuple[int, bytes]] = {}  # after -> (version, JSON), this version's answers
        self.taken = 0
        self.refused = 0

    def take(self, node_id: str, digest: kvdigest.Digest) -> bool:
        """One agent's digest; False when refused (a replica not on that node) or dropped (a lost one)."""
        node = self._nodes.get(digest.replica_id) if self._nodes is not None else None
        # A replica not in the table yet (its engine published before its Ready reached the table) is taken.
        if node not in (None, "", node_id) or (node is None and self._nodes is not None and
                                                digest.replica_id not in self.sets.replicas and
                                                len(self.sets.replicas) - len(self._routed) >= MAX_UNROUTED):
            self.refused += 1
            return False
        ok = self.sets.apply(digest)
        self.taken += ok
        self._changed.set()
        return ok

    def table_changed(self, doc: routing.EndpointsDoc) -> None:
        """The route table now: sets of replicas it no longer has are dropped."""
        if self._nodes is not None and doc.version == self._table_version:
            return
        self._table_version = doc.version
        self._nodes = {e.replica_id: e.node for m in doc.models for e in m.endpoints}
        before = self.sets.version
        # Dropped: the replicas the table routed and no longer does (one not routed yet may be starting).
        gone = self._routed - self._nodes.keys()
        self._routed = (self._routed & self._nodes.keys()) | self._nodes.keys()
        self.sets.keep_only(r for r in self.sets.replicas if r not in gone)
        if self.sets.version != before:
            self._changed.set()

    def doc(self, after: int, origin: str = "") -> kvdocs.KvDoc:
        """What a router at version ``after`` of relay ``origin`` needs now (-1 or another origin: a reset)."""
        changes = self.sets.since(after) if after >= 0 and origin == self.origin else None
        if changes is None:
            return kvdocs.KvDoc(self.sets.version, True, tuple(self.sets.snapshot()), self.origin)
        return kvdocs.KvDoc(self.sets.version, False, tuple(changes), self.origin)

    async def wait(self, *, after: int, origin: str, timeout: float) -> kvdocs.KvDoc:
        """``doc(after, origin)``, held up to ``timeout`` while there is nothing new."""
        after = after if origin == self.origin else -1
        await self._wait(after, timeout)
        return self.doc(after, origin)

    async def wait_json(self, *, after: int, origin: str, timeout: float) -> bytes:
        """``wait``'s document as JSON, encoded once per (after, version) for every router asking."""
        after = after if origin == self.origin else -1
        await self._wait(after, timeout)
        version = self.sets.version
        cached = self._docs.get(after)
        if cached is not None and cached[0] == version:
            return cached[1]
        if any(v != version for v, _ in self._docs.values()):
            self._docs.clear()
        body = json.dumps(self.doc(after, self.origin).to_doc(), separators=(",", ":")).encode()
        self._docs[after] = (version, body)
        return body

    async def _wait(self, after: int, timeout: float) -> None:
        if after < 0 or after != self.sets.version:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.sets.version == after:
            self._changed.clear()
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return
        await asyncio.sleep(self._coalesce_s)
