"""The fetcher's plain data: what is asked for, how far it has come, what the cache holds, one file to get."""

from __future__ import annotations

import dataclasses

from llmgw.core import sources

STATES = ("fetching", "stalled", "verifying", "done", "failed")


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    source: sources.Source
    sha256: str = ""          # expected, for an http/mirror single file
    file: str = ""            # spec.source_file: the one file of an hf repo (a .gguf)
    endpoint: str = ""        # hf: the HF-compatible endpoint (the cluster's mirror or the hub); mirror: its base URL
    token: str = dataclasses.field(default="", repr=False)   # hf: bearer token; repr=False so no log shows it


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    done_bytes: int
    total_bytes: int          # 0 = unknown yet
    rate_bps: float           # over the last few seconds, not since the start: a stall shows at once
    eta_s: float              # -1 = unknown
    state: str                # "fetching" | "stalled" | "verifying" | "done" | "failed"
    message: str = ""         # the reason, for stalled/failed


@dataclasses.dataclass(frozen=True, slots=True)
class Held:
    name: str                 # the cache name: what RemoveWeights names
    source: str               # the source text it was fetched from
    size_bytes: int
    fetched_at: float         # unix seconds
    last_used_at: float       # unix seconds; ensure() of a held source moves it


@dataclasses.dataclass(slots=True)
class FileJob:
    """One file to download: where from, where to inside the entry, and what it must turn out to be."""

    url: str
    rel: str                  # '/'-separated path inside the cache entry
    size: int = 0             # 0 = unknown until the server says
    sha256: str = ""          # "" = unknown: the size alone is checked
    headers: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)   # the token: never shown
