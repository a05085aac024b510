"""Remote weights before a launch: what to ask the fetcher, and how its progress reads upward.

A StartShard whose source is remote (hf://, http(s)://, mirror://) is FETCHING
until the fetcher (``llmgw.agent.fetch``, one per agent, single-flight per
source) holds the complete, verified weights; the launch then goes on with
their local path, exactly as for a file already on the node. The pieces here
are pure so that the supervisor's use of them is tested with plain data:

* ``request_of`` turns a spec into the fetcher's ``Request`` (None for a local
  source), with the token the control plane sent for it;
* ``stored`` is the spec as the agent keeps it: its status and its state file
  on disk never hold the hub's token (the state file outlives the shard on a
  disk anyone with root, or a backup, can read; the token is needed once, for
  the fetch);
* ``Throttle`` lets at most one progress report a second through, whatever
  the fetcher's own period: a report is a stream message and a control plane
  reconcile pass, and eight shards sharing one download would each send one
  per callback.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from llmgw.agent.fetch import records as fetch_records
from llmgw.core import inventory, sources
from llmgw.core.errors import SpecError
from llmgw.core.shards import FetchProgress, ShardSpec

#: The least time between two progress reports of one shard (the issue's "at most once a second").
REPORT_PERIOD_S = 1.0


class Fetcher(Protocol):
    """What the supervisor needs of ``llmgw.agent.fetch.Fetcher``."""

    async def ensure(self, req: fetch_records.Request, *,
                     on_progress: Callable[[fetch_records.Progress], None] | None = None) -> str: ...

    def remove(self, name: str) -> None: ...

    def held(self) -> list[Any]: ...


def is_remote(source: str) -> bool:
    """True for a source the agent must fetch before launching (a malformed one is the launch's to refuse)."""
    try:
        return bool(source) and sources.parse(source).remote
    except SpecError:
        return False


def request_of(spec: ShardSpec) -> fetch_records.Request | None:
    """The fetcher's request for ``spec``'s weights; None for a local source. SpecError for a malformed one."""
    if not spec.source:
        return None
    src = sources.parse(spec.source)
    if not src.remote:
        return None
    if src.kind == "hf":
        return fetch_records.Request(source=src, file=spec.source_file, endpoint=spec.hub_endpoint,
                                     token=spec.hub_token)
    if src.kind == "mirror":
        return fetch_records.Request(source=src, sha256=spec.source_sha256, endpoint=spec.mirror_url)
    return fetch_records.Request(source=src, sha256=spec.source_sha256)


def stored(spec: ShardSpec) -> ShardSpec:
    """``spec`` as the agent keeps it, in its status and its state file: without the hub's token."""
    return dataclasses.replace(spec, hub_token="") if spec.hub_token else spec


def progress_of(p: fetch_records.Progress) -> FetchProgress:
    return FetchProgress(done_bytes=p.done_bytes, total_bytes=p.total_bytes, rate_bps=p.rate_bps, eta_s=p.eta_s,
                         state=p.state, message=p.message)


def describe(source: str, p: FetchProgress) -> str:
    """The shard's message while it fetches: what, how far, and a stall's reason."""
    if p.total_bytes:
        pct = min(100, int(100 * p.done_bytes / p.total_bytes))
        far = f"{pct}% of {_size(p.total_bytes)}"
    else:
        far = f"{_size(p.done_bytes)} so far"
    said = f": {p.message}" if p.message else ""
    return f"fetching {source}: {p.state}, {far}{said}"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Throttle:
    """Passes a progress report when a second has gone by since the last one, or when its state changed."""

    def __init__(self, clock: Callable[[], float], *, period_s: float = REPORT_PERIOD_S) -> None:
        self._clock, self._period_s = clock, period_s
        self._last_at: float | None = None
        self._last_state = ""

    def due(self, p: FetchProgress) -> bool:
        now = self._clock()
        # A state change ("stalled", "verifying") is news worth the message at once.
        if self._last_at is not None and p.state == self._last_state and now - self._last_at < self._period_s:
            return False
        self._last_at, self._last_state = now, p.state
        return True


def mark_fetched(weights: Iterable[inventory.WeightFile], cache_dir: Path,
                 held: Iterable[Any]) -> tuple[inventory.WeightFile, ...]:
    """``weights`` as discovery found them, those llmgw fetched marked with their source, last use and cache name.

    A weight is the fetcher's when its path is an entry of the cache the
    fetcher records (``held``: its ``Held`` records), or lies inside one (a
    .gguf in a fetched repository). Anything else in the cache directory (a
    model someone copied there by hand) stays unmarked, so nothing will ask to
    remove it; partial downloads are in dot-directories, which discovery skips.
    """
    by_name = {h.name: h for h in held}
    root = os.path.abspath(cache_dir)
    out = []
    for w in weights:
        rel = os.path.relpath(os.path.abspath(w.path), root)
        first = rel.split(os.sep, 1)[0]
        h = by_name.get(first) if not rel.startswith("..") and first not in (".", "") else None
        if h is not None:
            w = dataclasses.replace(w, fetched_by_llmgw=True, source=h.source, cache_name=h.name,
                                    last_used_unix=int(h.last_used_at))
        out.append(w)
    return tuple(out)
