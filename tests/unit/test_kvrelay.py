"""The leader's KV relay: digests taken only from the replica's own node, a router's long poll answered with
the changes after its version (or every set, after a failover), and sets dropped with their replicas."""

from __future__ import annotations

import asyncio
import json

from llmgw.api import kvdocs, routemodels, routing
from llmgw.control.kvrelay import KvRelay
from llmgw.core import kvdigest

H16 = kvdigest.Hashing(16)


def _table(version: int, *replicas: tuple[str, str]) -> routing.EndpointsDoc:
    eps = tuple(routemodels.EndpointDoc(rid, f"http://127.0.0.1:{9000 + i}", node=node)
                for i, (rid, node) in enumerate(replicas))
    return routing.EndpointsDoc(version=version, models=(routemodels.ModelEntry("m", endpoints=eps),))


def test_a_router_long_polls_changes_and_a_failover_or_a_gone_replica_resets_or_drops() -> None:
    async def main() -> None:
        relay = KvRelay(coalesce_s=0.0)
        relay.table_changed(_table(1, ("r1", "n1"), ("r2", "n2")))
        # n2 cannot describe r1's engine.
        assert not relay.take("n2", kvdigest.Digest("r1", 1, 1, H16, (8,), full=True))
        assert relay.take("n1", kvdigest.Digest("r1", 1, 1, H16, (8, 16), full=True))
        first = await relay.wait(after=-1, origin="", timeout=0)
        assert first.reset and first.origin == relay.origin and sorted(first.changes[0].added) == [8, 16]
        # A poll at the current version waits for the next digest, then carries only it.
        poll = asyncio.create_task(relay.wait(after=first.version, origin=relay.origin, timeout=5))
        await asyncio.sleep(0)
        assert not poll.done()
        relay.take("n1", kvdigest.Digest("r1", 1, 2, H16, (24,), (8,)))
        got = await poll
        assert not got.reset and [(c.added, c.removed) for c in got.changes] == [((24,), (8,))]
        # The same version from another relay (a router that followed the old leader): every set whole.
        other = await relay.wait(after=got.version, origin="another-leader", timeout=5)
        assert other.reset and sorted(other.changes[0].added) == [16, 24]
        # JSON, built once for every router at one version.
        body = await relay.wait_json(after=first.version, origin=relay.origin, timeout=0)
        assert body is await relay.wait_json(after=first.version, origin=relay.origin, timeout=0)
        assert kvdocs.KvDoc.from_doc(json.loads(body)).changes == got.changes
        # r1 leaves the table: routers are told it is gone.
        relay.table_changed(_table(2, ("r2", "n2")))
        gone = await relay.wait(after=got.version, origin=relay.origin, timeout=0)
        assert [(c.replica_id, c.gone) for c in gone.changes] == [("r1", True)]
        timed_out = await relay.wait(after=gone.version, origin=relay.origin, timeout=0.01)
        assert timed_out.changes == () and not timed_out.reset

    asyncio.run(main())
