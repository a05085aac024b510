"""A replica's KV block set as it travels from its agent to the routers: sampled, 64-bit, as deltas (pure).

The agent follows each engine's events (``agent/kvfollow.py``) and, every ``INTERVAL_S``, sends the
control plane a ``Digest``: the keys added to and removed from the replica's *sampled* set since the
last one, or the whole set (``full``) after a new stream, an engine restart or a resync. The leader keeps
each replica's set (``Sets``) and a log of the changes, which routers long-poll (``api/kvdocs.py``).

* **Key**: the low 64 bits of a block's hash (``key64``), whether the engine publishes 64-bit ints
  (vLLM's default) or the 32 digest bytes: the same number ``kvhash.external(digest)`` gives.
* **Sampling**: of a 16-token-block engine only one block in ``rate(block_size)`` travels, chosen by
  its key (``key % rate == 0``), so about one in 8 (one per ~128 tokens; a 128-token-block engine, such
  as vLLM on CPU, sends every block). The choice needs no position: a block's hash chains its whole
  prefix, so the router hashes the prompt's blocks as the engine does and checks only the sampled ones:
  the deepest sampled block a replica holds gives its match (the blocks before it are its prefix), found
  to within a gap of unsampled blocks (8 on average). A prompt shorter than its first sampled block
  matches nothing and is placed by load.
* **Bounds**: ``MAX_KEYS`` keys per replica (an H100 holds ~19k blocks of 16: ~2.4k sampled); past it
  a replica's set is not grown (a block missing costs a worse score, never a wrong one).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Iterable

#: The engines that publish vLLM's KV events with ``--kv-events-config`` (the agent asks them to for a
#: ``kv_aware`` model; a change of routing to or from it restarts them: ``specmodel.fingerprint``).
PUBLISHERS = frozenset({"vllm", "sim"})

#: Sample one block in this many tokens' worth (a 16-token block: one in 8).
SAMPLE_TOKENS = 128
#: How often an agent sends the changes of each replica.
INTERVAL_S = 0.25
#: At most this many sampled keys per replica, on the agent and on the leader.
MAX_KEYS = 65_536
_MASK = (1 << 64) - 1


def key64(block_hash: int | bytes) -> int:
    """The low 64 bits of a block hash as events carry it (an int, or the digest's bytes read big-endian)."""
    if isinstance(block_hash, bytes):
        return int.from_bytes(block_hash[-8:], "big")
    return block_hash & _MASK


def rate(block_size: int) -> int:
    """One block in how many is sampled for an engine of ``block_size`` tokens a block (1: every block)."""
    return max(1, SAMPLE_TOKENS // max(1, block_size))


def sampled(key: int, every: int) -> bool:
    return every <= 1 or key % every == 0


@dataclasses.dataclass(frozen=True, slots=True)
class Hashing:
    """How the engine hashes, so a router can hash a prompt the same way (``core.kvhash``)."""

    block_size: int
    algo: str = "sha256"
    #: The engine's PYTHONHASHSEED ("": unset, vLLM's fixed seed).
    seed: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Digest:
    """One replica's changes (or, ``full``, its whole sampled set) since the last digest of its engine ``epoch``."""

    replica_id: str
    #: Names the engine process (its start): a new epoch is a new, empty cache.
    epoch: int
    #: Counts this engine's digests from 1: a gap means one was lost (the leader then asks for nothing;
    #: it drops the replica's set until a full one comes, which the agent sends when told, or every new stream).
    seq: int
    hashing: Hashing
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    full: bool = False


class Sampler:
    """The agent's side of one replica: the sampled set last sent, and the next digest from the engine's set."""

    def __init__(self, replica_id: str, epoch: int) -> None:
        self.replica_id, self.epoch = replica_id, epoch
        self.sent: set[int] = set()
        self.seq = 0
        self.must_resend = True

    def resend(self) -> None:
        """A new stream (a new leader knows nothing): the next digest is the whole set."""
        self.must_resend = True

    def next(self, blocks: Iterable[int | bytes], hashing: Hashing | None) -> Digest | None:
        """The digest to send now for the engine's current ``blocks``; None when nothing changed (or not known yet)."""
        if hashing is None:
            return None
        every = rate(hashing.block_size)
        # vLLM's default int hashes are their own keys (64 bits, unsigned): one pass, no conversion.
        if all(type(h) is int for h in itertools.islice(blocks, 1)) and every > 1:
            now = {h & _MASK for h in blocks if not h % every}  # type: ignore[operator]
        else:
            now = {k for k in map(key64, blocks) if sampled(k, every)}
        if len(now) > MAX_KEYS:
            now = set(sorted(now)[:MAX_KEYS])
        full = self.must_resend
        if full:
            added, removed = tuple(now), ()
        else:
            added, removed = tuple(now - self.sent), tuple(self.sent - now)
            if not added and not removed:
                return None
        self.sent, self.must_resend = now, False
        self.seq += 1
        return Digest(self.replica_id, self.epoch, self.seq, hashing, added, removed, full)


@dataclasses.dataclass(slots=True)
class ReplicaSet:
    epoch: int
    seq: int
    hashing: Hashing
    keys: set[int]


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One entry of the leader's log: a replica's set replaced (``full``), changed, or dropped (``gone``)."""

    version: int
    replica_id: str
    hashing: Hashing | None = None
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    full: bool = False
    gone: bool = False


class Sets:
    """The leader's per-replica sampled sets and the log of their changes, numbered by ``version``.

    ``since(v)`` is what a router at version ``v`` needs: the changes after it, or None when the log no
    longer reaches back (the router then takes ``snapshot()``). The log keeps at most ``log_size`` changes.
    """

    def __init__(self, *, log_size: int = 4096) -> None:
        self.replicas: dict[str, ReplicaSet] = {}
        self.version = 0
        self._log: deque[Change] = deque(maxlen=log_size)

    def apply(self, d: Digest) -> bool:
        """Takes one digest; False when it was dropped (a stale epoch, or a gap: the set waits for a full one)."""
        cur = self.replicas.get(d.replica_id)
        if not d.full:
            if cur is None or cur.epoch != d.epoch or d.seq != cur.seq + 1:
                if cur is not None:
                    self.drop(d.replica_id)  # a lost digest: nothing known is better than something wrong
                return False
            cur.seq = d.seq
            cur.keys.difference_update(d.removed)
            room = MAX_KEYS - len(cur.keys)
            added = d.added if len(d.added) <= room else d.added[:max(0, room)]
            cur.keys.update(added)
            self._log_change(Change(0, d.replica_id, d.hashing, added, d.removed))
            return True
        keys = set(d.added[:MAX_KEYS])
        if cur is not None and cur.epoch == d.epoch and cur.hashing == d.hashing:
            # The same engine's whole set again (a new stream, or the periodic one): routers get the difference.
            added, removed = tuple(keys - cur.keys), tuple(cur.keys - keys)
            cur.keys, cur.seq = keys, d.seq
            if added or removed:
                self._log_change(Change(0, d.replica_id, d.hashing, added, removed))
            return True
        self.replicas[d.replica_id] = ReplicaSet(d.epoch, d.seq, d.hashing, keys)
        self._log_change(Change(0, d.replica_id, d.hashing, tuple(keys), full=True))
        return True

    def drop(self, replica_id: str) -> None:
        """The replica is gone (or its set no longer trusted)."""
        if self.replicas.pop(replica_id, None) is not None:
            self._log_change(Change(0, replica_id, gone=True))

    def keep_only(self, replica_ids: Iterable[str]) -> None:
        """Drops every replica not in ``replica_ids`` (those the route table no longer has)."""
        keep = set(replica_ids)
        for rid in [r for r in self.replicas if r not in keep]:
            self.drop(rid)

    def since(self, version: int) -> list[Change] | None:
        if version == self.version:
            return []
        if version > self.version or not self._log or self._log[0].version > version + 1:
            return None
        return [c for c in self._log if c.version > version]

    def snapshot(self) -> list[Change]:
        return [Change(self.version, rid, s.hashing, tuple(s.keys), full=True) for rid, s in self.replicas.items()]

    def _log_change(self, c: Change) -> None:
        self.version += 1
        self._log.append(dataclasses.replace(c, version=self.version))
