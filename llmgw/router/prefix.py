"""Prefix-cache-aware routing: send a prompt to the replica that already holds its prefix.

An engine with prefix caching (vLLM, SGLang, llama.cpp's slots) skips the prefill
of any leading part of a prompt whose KV blocks it still holds. The router cannot
see those blocks, so it remembers where it sent each prompt prefix:

* the prompt is the text as the client sent it: a completion's ``prompt``, or a
  chat's messages as role and content concatenated in order, so a shared system
  prompt gives shared leading blocks. No tokenizing: characters stand in for
  tokens, and a block of ``BLOCK_CHARS`` characters is about 64 tokens; a
  completion whose prompt is token ids has blocks of ``BLOCK_TOKENS`` ids;
* the text is cut into fixed-size blocks, and block i's hash covers blocks 0..i
  (chained), so equal hashes mean equal prefixes, not merely equal blocks. Only
  whole blocks count: a trailing partial block is not a prefix another prompt
  can share. Hashes are Python's ``hash`` of the slices, salted per process:
  the index lives in this process only, so that is enough, and it is cheap
  (measured: 13 µs to hash a 20 KB prompt, 18 µs more to pick and record it);
* ``PrefixIndex`` maps block hash to the replicas last sent it, an LRU bounded in
  entries across all models (the model's name salts the hashes);
* ``PrefixCache.choose`` takes the replica where the prompt costs least: the
  blocks it lacks there, the prefill already queued there, and a weight per
  request in flight (its docstring says why that and not a load ratio); the
  choice is recorded for every block.

Pure: no I/O and no clock; ``request_key`` works on the already-parsed body.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from llmgw.core import engines
from llmgw.router.pick import NO_KEY, E, LeastOutstanding, RequestKey

BLOCK_CHARS = 256
#: A token-id prompt's block: about as many tokens as ``BLOCK_CHARS`` characters hold.
BLOCK_TOKENS = 64
#: About 200k blocks of 256 characters is 50M characters (~12M tokens) of prompt,
#: more than the KV caches of a few replicas hold, in about 25 MB of router memory.
MAX_ENTRIES = 200_000
#: Replicas remembered per block: enough for a system prompt every replica of a model holds.
HOLDERS = 4

_NO_LOAD: Mapping[str, float] = {}
_INT = {int}


def prompt_text(doc: Mapping[str, Any]) -> str:
    """The prompt text of a chat or completion body, in order; "" when it has none the router can read."""
    messages = doc.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        for message in messages:
            if not isinstance(message, Mapping):
                continue
            # Separators the client cannot easily type keep "ab"+"c" apart from "a"+"bc".
            parts.append(f"{message.get('role', '')}\x1f")
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content parts: only the text ones shape the prefix
                parts.extend(p["text"] for p in content
                             if isinstance(p, Mapping) and isinstance(p.get("text"), str))
            parts.append("\x1e")
        return "".join(parts)
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]  # a batch goes to one engine; its first prompt stands for it
    return ""


def block_hashes(text: str, *, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """The chained hashes of ``text``'s whole blocks: entry i covers characters [0, (i+1)*block_chars)."""
    hashes: list[int] = []
    h = 0
    for start in range(0, len(text) - block_chars + 1, block_chars):
        h = hash((h, text[start:start + block_chars]))
        hashes.append(h)
    return tuple(hashes)


def session_of(doc: Mapping[str, Any], *, header: str = "") -> str:
    """The session key: the ``x-llmgw-session`` header when given, else the body's ``user`` field."""
    if header:
        return header
    user = doc.get("user")
    return user if isinstance(user, str) else ""


def prompt_tokens(doc: Mapping[str, Any]) -> tuple[int, ...]:
    """A completion's prompt given as token ids (or a batch's first such prompt); () otherwise."""
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and set(map(type, prompt)) == _INT:  # half all()'s cost, in C
        return tuple(prompt)
    return ()


def token_blocks(ids: Sequence[int], *, block_tokens: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """The chained hashes of a token-id prompt's whole blocks of ``block_tokens`` ids (as ``block_hashes``)."""
    hashes: list[int] = []
    h = 0
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = hash((h, tuple(ids[start:start + block_tokens])))
        hashes.append(h)
    return tuple(hashes)


def request_key(doc: Mapping[str, Any], *, session_header: str = "", block_chars: int = BLOCK_CHARS,
                tokens: bool = False) -> RequestKey:
    """The affinity key of a parsed completion body; ``tokens``: with its token ids (only ``kv_aware`` reads them).

    A prompt given as token ids has no text: its blocks are ``BLOCK_TOKENS`` ids each (without them it had
    none, and ``prefix_cache`` placed every such request by load alone, bench/README.md's kv_vllm_bench)."""
    text = prompt_text(doc)
    ids = prompt_tokens(doc) if tokens or not text else ()
    return RequestKey(session=session_of(doc, header=session_header),
                      blocks=block_hashes(text, block_chars=block_chars) if text else token_blocks(ids),
                      tokens=ids if tokens else ())


class PrefixIndex:
    """Block hash -> the replicas last sent that block (up to ``HOLDERS``, latest last); LRU bounded."""

    def __init__(self, *, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._where: collections.OrderedDict[int, tuple[str, ...]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def get(self, block: int) -> str | None:
        """The replica ``block`` was last sent to, or None."""
        holders = self._where.get(block)
        return holders[-1] if holders else None

    def holders(self, block: int) -> tuple[str, ...]:
        return self._where.get(block, ())

    def record(self, blocks: Iterable[int], replica_id: str) -> None:
        where = self._where
        for block in blocks:
            holders = where.get(block, ())
            if not holders or holders[-1] != replica_id:
                holders = (*(h for h in holders if h != replica_id), replica_id)[-HOLDERS:]
                where[block] = holders
            where.move_to_end(block)
        while len(where) > self.max_entries:
            where.popitem(last=False)


class PrefixCache:
    """The replica where a request's prompt would cost least: prefill still queued there plus what it lacks.

    For each replica: the blocks of this prompt it does not hold (what it must
    prefill), plus the blocks of prompts sent to it that are still in their
    prefill (``charge``: the queue in front of this one), plus ``decode_weight``
    blocks per request in flight there (each decoding request shares the engine's
    steps). The least wins; among equals, the least loaded, then round-robin.

    This is the balance the affinity needs: a replica holding the prefix keeps
    its requests until the work queued on it outweighs what the prefix saves,
    and no longer (affinity alone hot-spots a replica: every user of a popular
    system prompt queues on one engine while the others idle), while a
    conversation is not moved off its replica by a momentary imbalance when
    moving it would mean evaluating its whole history again elsewhere. The
    threshold is the prefill a miss costs, not a fixed ratio: a fixed one moved
    conversations with 700 cached tokens to save a queue of two short turns.
    """

    def __init__(self, index: PrefixIndex | None = None, *, decode_weight: float = 1.0) -> None:
        self.index = index if index is not None else PrefixIndex()
        self.decode_weight = decode_weight
        self._least = LeastOutstanding()
        #: Blocks still to be prefilled on each replica, by requests not yet past their first token.
        self.pending: dict[str, float] = {}
        self._charges: dict[int, tuple[str, float]] = {}
        self._next = 0

    def pick(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = _NO_LOAD,
             key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> E | None:
        return self.choose(model, endpoints, load=load, key=key, exclude=exclude)[0]

    def choose(self, model: str, endpoints: Sequence[E], *, load: Mapping[str, float] = _NO_LOAD,
               key: RequestKey = NO_KEY, exclude: Collection[str] = ()) -> tuple[E | None, int]:
        """The replica chosen (recorded as holding every block), and how many blocks it lacked."""
        if not key.blocks:
            return self._least.pick(model, endpoints, load=load, exclude=exclude), 0
        salt = hash(model)  # the same prompt to two models must not share entries
        blocks = [b ^ salt for b in key.blocks]
        depth = {e.replica_id: 0 for e in endpoints if e.replica_id not in exclude}
        if not depth:
            return None, 0
        for i, block in enumerate(blocks):  # chained: a replica's first miss ends its match
            extended = False
            for replica in self.index.holders(block):
                if depth.get(replica) == i:
                    depth[replica] = i + 1
                    extended = True
            if not extended:
                break
        n = len(blocks)
        pending, weight = self.pending, self.decode_weight
        cost = {r: pending.get(r, 0.0) + (n - d) + weight * load.get(r, 0.0) for r, d in depth.items()}
        best = min(cost.values())
        tied = {r for r, c in cost.items() if c <= best + 1e-9}
        chosen = self._least.pick(model, endpoints, load=load,
                                  exclude=[e.replica_id for e in endpoints if e.replica_id not in tied])
        assert chosen is not None  # tied is non-empty and within the endpoints
        self.index.record(blocks, chosen.replica_id)
        return chosen, n - depth[chosen.replica_id]

    def charge(self, replica_id: str, blocks: float) -> int | None:
        """``blocks`` more to prefill on ``replica_id``; the token to ``settle`` once its first token is back."""
        if blocks <= 0:
            return None
        self._next += 1
        self._charges[self._next] = (replica_id, blocks)
        self.pending[replica_id] = self.pending.get(replica_id, 0.0) + blocks
        return self._next

    def settle(self, token: int | None) -> None:
        """The charged request is past its prefill (its first token came, or it ended or failed)."""
        entry = self._charges.pop(token, None) if token is not None else None
        if entry is None:
            return
        replica_id, blocks = entry
        left = self.pending.get(replica_id, 0.0) - blocks
        if left > 1e-9:
            self.pending[replica_id] = left
        else:
            self.pending.pop(replica_id, None)


def exclusive_prefix(engine: str) -> bool:
    """Whether ``engine``'s cached prefix serves one request at a time; False for one not known.

    There ``Prefilling``'s wait is not used. It is the engine's record's ``prefix_cache_shared``
    (llmgw.core.engines), False for llama.cpp. Measured on llama.cpp (xllamacpp 2026.10, 4 slots,
    SmolLM2, a 600-token system prompt): a second request sharing it, sent while the first decodes,
    evaluated all 607 prompt tokens (2.5 s); sent after the first ended, 7 (62 ms). Its prompt
    cache moves a state into the slot that loads it, so a follower made to wait for the leader's
    end would take the leader's copy, and the leader's conversation, whose next turn needed it,
    would compute its whole history again (measured in bench/prefix_workload.py: four later turns
    of ~700 tokens cold instead of four first turns). Computing the prefix again gives each
    conversation its own copy, and only the new conversation pays.
    """
    found = engines.record(engine)
    return found is not None and not found.prefix_cache_shared


class Prefilling:
    """Prompts sent to a replica whose first token has not come back yet: their prefix is being computed there.

    Engines reuse only a prefix they have finished computing: a second request
    with the same long system prompt, sent while the first is still in its
    prefill, gets another slot and computes the whole prefix again (measured on
    llama.cpp with SmolLM2: a 600-token prefill takes 2.4 s on one core; the same
    prompt sent while the first is decoding starts its answer in 62 ms). A burst of
    a chat product's users then costs one full prefill each, all competing for
    the same engine at once. So a request whose prompt shares at least
    ``min_blocks`` leading blocks with one still prefilling on the replica it was
    sent to waits for that one's first token (the ``leader``) and is then a cache
    hit. Waiting never costs the follower much: the leader started first on the
    same prefix, so its prefill ends no later than the follower's own would.

    Pure bookkeeping; the waiting itself (events, timeouts) is the caller's.
    Hashes are salted with the model's name like ``PrefixCache``'s.
    """

    def __init__(self, *, min_blocks: int = 4) -> None:
        self.min_blocks = min_blocks
        #: (replica, salted block) -> the tokens covering it, latest last.
        self._by_block: dict[tuple[str, int], list[int]] = {}
        self._tokens: dict[int, tuple[str, tuple[int, ...]]] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._tokens)

    def leader(self, model: str, replica_id: str, blocks: Sequence[int]) -> int | None:
        """The token of the prefilling request sharing the longest prefix (>= min_blocks) with ``blocks``."""
        if len(blocks) < self.min_blocks or not self._by_block:
            return None
        salt = hash(model)
        found: int | None = None
        matched = 0
        for i, block in enumerate(blocks):
            tokens = self._by_block.get((replica_id, block ^ salt))
            if not tokens:
                break
            found, matched = tokens[-1], i + 1
        return found if matched >= self.min_blocks else None

    def begin(self, model: str, replica_id: str, blocks: Sequence[int]) -> int | None:
        """Registers a request just sent to ``replica_id``; the token to ``end`` it with, or None if too short."""
        if len(blocks) < self.min_blocks:
            return None
        salt = hash(model)
        self._next += 1
        token = self._next
        salted = tuple(b ^ salt for b in blocks)
        self._tokens[token] = (replica_id, salted)
        for block in salted:
            # The latest request covering a block leads it; when it ends, an earlier one
            # still covering the block leads again.
            self._by_block.setdefault((replica_id, block), []).append(token)
        return token

    def end(self, token: int | None) -> None:
        """The request's first token came back (or it failed, or was cancelled): its followers may go."""
        if token is None:
            return
        entry = self._tokens.pop(token, None)
        if entry is None:
            return
        replica_id, salted = entry
        for block in salted:
            key = (replica_id, block)
            tokens = self._by_block.get(key)
            if tokens is not None:
                tokens.remove(token)
                if not tokens:
                    del self._by_block[key]
