"""The replicas' sampled KV block sets as routers read them: ``KvDoc`` (``GET /api/v1/router/kv``, long-polled).

Part of the control plane <-> router contract. The leader keeps each replica's set and a numbered log
of changes (``core.kvdigest.Sets``); a router asks with the version it has and gets either the changes
after it, or (``reset``: it had none, missed too many, or follows another control plane now) every set
whole, to replace what it held. ``origin`` names the leader's relay the versions count in: a router asks
with the one it read, and after a failover the new leader answers a reset::

    {"version": 42, "origin": "5f0c…", "reset": false, "changes": [
        {"replica": "m-1a2b3c", "block_size": 16, "algo": "sha256", "seed": "",
         "added": "<base64 of 8-byte big-endian keys>", "removed": "...", "full": false},
        {"replica": "m-9f8e7d", "gone": true}]}

Keys travel packed (8 bytes each, base64: ~11 characters a key). Read tolerantly: an unknown field is
ignored (a newer control plane), a malformed change raises ``WireError`` naming the field.
"""

from __future__ import annotations

import base64
import dataclasses
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from llmgw.api.reports import WireError
from llmgw.core import kvdigest


def pack(keys: Sequence[int]) -> str:
    return base64.b64encode(struct.pack(f">{len(keys)}Q", *keys)).decode("ascii")


def unpack(text: str, field: str) -> tuple[int, ...]:
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, TypeError):
        raise WireError(f"{field}: expected base64 of 8-byte keys") from None
    if len(raw) % 8:
        raise WireError(f"{field}: {len(raw)} bytes is not a whole number of 8-byte keys")
    return struct.unpack(f">{len(raw) // 8}Q", raw)


@dataclasses.dataclass(frozen=True, slots=True)
class KvDoc:
    version: int
    reset: bool
    changes: tuple[kvdigest.Change, ...] = ()
    #: Names the relay (one leader's run) the versions are counted by: asked with another, it answers a reset.
    origin: str = ""

    def to_doc(self) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for c in self.changes:
            if c.gone:
                out.append({"replica": c.replica_id, "gone": True})
                continue
            assert c.hashing is not None
            item: dict[str, Any] = {"replica": c.replica_id, "block_size": c.hashing.block_size,
                                    "algo": c.hashing.algo, "seed": c.hashing.seed, "added": pack(c.added)}
            if c.removed:
                item["removed"] = pack(c.removed)
            if c.full:
                item["full"] = True
            out.append(item)
        return {"version": self.version, "origin": self.origin, "reset": self.reset, "changes": out}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> KvDoc:
        if not isinstance(doc, Mapping):
            raise WireError("a KV document is a JSON object")
        version, reset, raw = doc.get("version"), doc.get("reset", False), doc.get("changes", [])
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise WireError("version: expected a non-negative integer")
        if not isinstance(raw, list):
            raise WireError("changes: expected a list")
        changes: list[kvdigest.Change] = []
        for i, c in enumerate(raw):
            field = f"changes[{i}]"
            if not isinstance(c, Mapping) or not isinstance(c.get("replica"), str):
                raise WireError(f"{field}.replica: expected a string")
            if c.get("gone"):
                changes.append(kvdigest.Change(version, c["replica"], gone=True))
                continue
            size, algo, seed = c.get("block_size"), c.get("algo", "sha256"), c.get("seed", "")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise WireError(f"{field}.block_size: expected a positive integer")
            if not isinstance(algo, str) or not isinstance(seed, str):
                raise WireError(f"{field}.algo/seed: expected strings")
            changes.append(kvdigest.Change(
                version, c["replica"], kvdigest.Hashing(size, algo, seed),
                unpack(c.get("added", ""), f"{field}.added"), unpack(c.get("removed", ""), f"{field}.removed"),
                full=bool(c.get("full", False))))
        origin = doc.get("origin", "")
        return cls(version, bool(reset), tuple(changes), origin if isinstance(origin, str) else "")
