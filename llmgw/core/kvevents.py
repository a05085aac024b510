"""vLLM's KV cache events: the wire format, and one replica's block set kept from them (pure: standard library).

What vLLM sends (vLLM 0.32's ``vllm/distributed/kv_events.py`` and ``vllm/config/kv_events.py``;
upstream https://github.com/vllm-project/vllm/blob/main/vllm/distributed/kv_events.py, docs
https://docs.vllm.ai/en/latest/api/vllm/config/kv_events.html):

* Asked with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
  "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": ""}'``
  (``KVEventsConfig``; also ``buffer_steps`` = 10,000 batches kept for replay, ``hwm``). An endpoint
  with ``*`` (or ipc/inproc) is bound, any other is connected to; data-parallel rank ``r`` adds ``r``
  to the port.
* The PUB socket sends each batch as three frames: the topic (utf-8), the sequence number
  (8 bytes big-endian, from 0 per publisher: a restart starts again at 0), the payload.
* The payload is ``msgspec.msgpack`` of ``KVEventBatch``: an array ``[ts, events, data_parallel_rank]``
  (``array_like``); each event is a map tagged ``"type"``: ``BlockStored{block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, lora_name}`` (plus, omitted when unset,
  ``extra_keys``, ``group_idx``, …), ``BlockRemoved{block_hashes, medium}``, ``AllBlocksCleared{}``.
  Older vLLM releases made the events ``array_like`` too (``[tag, field, …]``): both are read.
  Hashes are 64-bit ints by default (``core.kvhash.external``).
* Replay: a DEALER/REQ sends ``(b"", start_seq as 8 bytes big-endian)`` to the ROUTER
  ``replay_endpoint``; it answers every buffered batch with ``seq >= start_seq`` as
  ``(b"", topic, seq, payload)`` and then ``(b"", b"", -1 as 8 signed bytes, b"")``.

``tests/fixtures/vllm_kv/hashes.json`` holds a batch vLLM's own classes encoded, and
``real_cpu_capture.json`` one a real vLLM 0.32 CPU engine published (so the CPU build does publish:
its scheduler builds the publisher whatever the platform; its blocks are 128 tokens, ``medium``
"GPU"); the unit tests decode both and encode each to the same bytes (the sim engine publishes
with ``encode_batch``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from llmgw.core import msgpackmini

Hash = int | bytes
#: The replay socket's end-of-replay marker (``ZmqEventPublisher.END_SEQ``).
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[Hash, ...]
    parent: Hash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = "GPU"
    lora_name: str | None = None
    #: Sent by vLLM 0.32 when set (omitted when None): one extra-keys entry per block, the KV cache group
    #: and its kind (a real CPU engine sends ``[None, …]``, ``0`` and ``"full_attention"``).
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None
    spec_kind: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[Hash, ...]
    medium: str | None = "GPU"


@dataclasses.dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None


_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                           "medium", "lora_name"),
           "BlockRemoved": ("block_hashes", "medium"), "AllBlocksCleared": ()}


def _event(raw: Any) -> Event | None:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):  # array_like: [tag, field, ...]
        raw = {"type": raw[0], **dict(zip(_FIELDS.get(raw[0], ()), raw[1:], strict=False))}
    if not isinstance(raw, dict):
        raise ValueError("a KV event is neither a tagged map nor a tagged array")
    kind = raw.get("type")
    if kind == "BlockStored":
        extra = raw.get("extra_keys")
        return Stored(tuple(raw["block_hashes"]), raw.get("parent_block_hash"), tuple(raw["token_ids"]),
                      int(raw["block_size"]), raw.get("medium"), raw.get("lora_name"),
                      tuple(extra) if isinstance(extra, list) else None, raw.get("group_idx"),
                      raw.get("kv_cache_spec_kind"))
    if kind == "BlockRemoved":
        return Removed(tuple(raw["block_hashes"]), raw.get("medium"))
    if kind == "AllBlocksCleared":
        return Cleared()
    return None  # an event kind this release does not know: skipped, as msgspec would refuse it


def decode_batch(payload: bytes) -> Batch:
    """A ``KVEventBatch`` payload (the third frame); ValueError when it is not one."""
    raw = msgpackmini.decode(payload)
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise ValueError("a KV event batch is an array [ts, events, data_parallel_rank]")
    events = tuple(e for e in map(_event, raw[1]) if e is not None)
    return Batch(float(raw[0]), events, raw[2] if len(raw) > 2 else None)


def encode_batch(batch: Batch) -> bytes:
    """The payload vLLM 0.32 sends for ``batch`` (its msgspec layout, field for field)."""
    events: list[dict[str, Any]] = []
    for e in batch.events:
        if isinstance(e, Stored):
            stored: dict[str, Any] = {
                "type": "BlockStored", "block_hashes": list(e.hashes), "parent_block_hash": e.parent,
                "token_ids": list(e.token_ids), "block_size": e.block_size, "lora_id": None, "medium": e.medium,
                "lora_name": e.lora_name}
            for name, value in (("extra_keys", e.extra_keys), ("group_idx", e.group_idx),
                                ("kv_cache_spec_kind", e.spec_kind)):
                if value is not None:  # msgspec's omit_defaults
                    stored[name] = list(value) if isinstance(value, tuple) else value
            events.append(stored)
        elif isinstance(e, Removed):
            events.append({"type": "BlockRemoved", "block_hashes": list(e.hashes), "medium": e.medium})
        else:
            events.append({"type": "AllBlocksCleared"})
    body: list[Any] = [batch.ts, events]
    if batch.dp_rank is not None:
        body.append(batch.dp_rank)
    return msgpackmini.encode(body)


@dataclasses.dataclass(frozen=True, slots=True)
class Gap:
    """Batches were missed: ask the replay endpoint for every batch from ``start``."""

    start: int


class ReplicaBlocks:
    """The blocks one engine holds on its accelerator, kept from its event stream in sequence order.

    ``apply`` takes each (sequence, payload) as it comes: a duplicate (a replayed batch already seen)
    is skipped; a jump ahead returns a ``Gap`` and applies nothing (replay from ``Gap.start``, which
    covers the batch that showed the gap, then carry on; ``resync`` when the replay cannot cover it);
    sequence 0 after others is a restarted engine, whose cache is empty: the set is cleared.
    """

    #: Media counted as held: the accelerator's cache (None: a publisher that does not say).
    MEDIA = frozenset({"GPU", None})

    def __init__(self) -> None:
        self.blocks: set[Hash] = set()
        self.block_size: int | None = None
        self.next_seq: int | None = None
        #: Bumped on every change: a view sent on only when it moved.
        self.version = 0

    def apply(self, seq: int, payload: bytes) -> Gap | None:
        if self.next_seq is not None:
            if seq == 0 and self.next_seq > 0:
                self.clear()  # the engine restarted: its sequence and its cache begin again
            elif seq < self.next_seq:
                return None
            elif seq > self.next_seq:
                return Gap(self.next_seq)
        self.apply_batch(decode_batch(payload))
        self.next_seq = seq + 1
        return None

    def apply_batch(self, batch: Batch) -> None:
        for e in batch.events:
            if isinstance(e, Stored):
                if e.medium in self.MEDIA:
                    self.blocks.update(e.hashes)
                    self.block_size = e.block_size
            elif isinstance(e, Removed):
                if e.medium in self.MEDIA:
                    self.blocks.difference_update(e.hashes)
            else:
                self.blocks.clear()
        self.version += 1

    def resync(self, seq: int) -> None:
        """The replay could not cover the gap: forget what is known, and trust the stream from ``seq``."""
        self.clear()
        self.next_seq = seq

    def clear(self) -> None:
        self.blocks.clear()
        self.next_seq = None
        self.version += 1
