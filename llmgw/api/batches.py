"""Batch lines on the control plane <-> router wire (issue 32), as typed documents.

A router runs batches' lines on the capacity its interactive requests leave. Two exchanges, each a router's POST
with its router credential, answered by any control plane (both write the shared database, conditionally, so a
failover loses nothing and answers nothing twice):

- ``POST /api/v1/router/batch/claim``: a ``LineClaim`` (this router, the models it may run lines of now, how
  many at most), answered ``ClaimedLines``: the lines, each held by this router for ``lease_s`` seconds.
- ``POST /api/v1/router/batch/results``: ``LineResults`` (each line's status and answer, the lines it gives back
  unrun, the batches it holds lines of), answered ``ResultsAck``: how many were written (a line answered already
  keeps its first answer) and which of the batches held are no longer running (cancelled, expired): their lines
  still held are given back unrun.

Strict reading on both sides: a bad field is ``BadReport`` naming it (422 at the control plane); unknown fields
are ignored, so either side may be newer. Standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from llmgw.api.reports import MAX_ROUTER_ID, BadReport

#: The OpenAI API's paths the control plane serves itself (a router passes them on): files and batches.
OPENAI_PREFIXES = ("/v1/files", "/v1/batches")
CLAIM_PATH = "/api/v1/router/batch/claim"
RESULTS_PATH = "/api/v1/router/batch/results"
#: More lines than one claim or one results document may carry.
MAX_LINES = 1000
MAX_MODELS = 1000


def openai_path(path: str) -> bool:
    """Whether ``path`` is ``/v1/files...`` or ``/v1/batches...``."""
    return any(path == p or path.startswith(p + "/") for p in OPENAI_PREFIXES)


def _text(doc: Any, name: str, limit: int, *, where: str) -> str:
    value = doc.get(name, "") if isinstance(doc, dict) else None
    if not isinstance(value, str) or len(value) > limit:
        raise BadReport(f"{where}.{name} must be a string of at most {limit} characters")
    return value


def _int(doc: dict[str, Any], name: str, *, where: str, low: int = 0, high: int = 10**9) -> int:
    value = doc.get(name, 0)
    if type(value) is not int or not low <= value <= high:
        raise BadReport(f"{where}.{name} must be a whole number from {low} to {high}")
    return value


def _dict(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadReport(f"{where} must be an object")
    return doc


def _list(doc: dict[str, Any], name: str, where: str, limit: int) -> list[Any]:
    value = doc.get(name, [])
    if not isinstance(value, list) or len(value) > limit:
        raise BadReport(f"{where}.{name} must be a list of at most {limit} items")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class LineClaim:
    router: str
    models: tuple[str, ...]
    max_lines: int

    def to_doc(self) -> dict[str, Any]:
        return {"router": self.router, "models": list(self.models), "max_lines": self.max_lines}

    @classmethod
    def from_doc(cls, doc: Any) -> LineClaim:
        doc = _dict(doc, "claim")
        models = _list(doc, "models", "claim", MAX_MODELS)
        if not all(isinstance(m, str) and 0 < len(m) <= 253 for m in models):
            raise BadReport("claim.models must be model names")
        return cls(_text(doc, "router", MAX_ROUTER_ID, where="claim"), tuple(models),
                   _int(doc, "max_lines", where="claim", high=MAX_LINES))


@dataclasses.dataclass(frozen=True, slots=True)
class Line:
    """One line to run: ``body`` is the request's JSON, ``url`` the batch's endpoint; run as ``key`` of
    ``project`` (usage metered there, marked batch)."""

    batch: str
    idx: int
    custom_id: str
    model: str
    url: str
    body: str
    project: str
    key: str
    user: str

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: Any) -> Line:
        doc = _dict(doc, "line")
        return cls(_text(doc, "batch", 40, where="line"), _int(doc, "idx", where="line"),
                   _text(doc, "custom_id", 512, where="line"), _text(doc, "model", 253, where="line"),
                   _text(doc, "url", 40, where="line"), _text(doc, "body", 1 << 26, where="line"),
                   _text(doc, "project", 63, where="line"), _text(doc, "key", 32, where="line"),
                   _text(doc, "user", 63, where="line"))


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedLines:
    lines: tuple[Line, ...]
    lease_s: float

    def to_doc(self) -> dict[str, Any]:
        return {"lines": [line.to_doc() for line in self.lines], "lease_s": self.lease_s}

    @classmethod
    def from_doc(cls, doc: Any) -> ClaimedLines:
        doc = _dict(doc, "claimed")
        lease = doc.get("lease_s", 0)
        if not isinstance(lease, int | float) or isinstance(lease, bool) or lease < 0:
            raise BadReport("claimed.lease_s must be a number of seconds")
        return cls(tuple(Line.from_doc(x) for x in _list(doc, "lines", "claimed", MAX_LINES)), float(lease))


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """A line's outcome: the engine's status and answer (JSON text), or ``error`` (``{"code", "message"}`` JSON)
    when the request could not be sent."""

    batch: str
    idx: int
    status_code: int
    response: str
    error: str = ""

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: Any) -> Result:
        doc = _dict(doc, "result")
        return cls(_text(doc, "batch", 40, where="result"), _int(doc, "idx", where="result"),
                   _int(doc, "status_code", where="result", high=999), _text(doc, "response", 1 << 26, where="result"),
                   _text(doc, "error", 4096, where="result"))


def _pairs(doc: dict[str, Any], name: str) -> tuple[tuple[str, int], ...]:
    out = []
    for x in _list(doc, name, "results", MAX_LINES):
        if (not isinstance(x, list) or len(x) != 2 or not isinstance(x[0], str) or len(x[0]) > 40
                or type(x[1]) is not int or x[1] < 0):
            raise BadReport(f"results.{name} must be [batch, line] pairs")
        out.append((x[0], x[1]))
    return tuple(out)


def _names(doc: dict[str, Any], name: str, where: str) -> tuple[str, ...]:
    value = _list(doc, name, where, MAX_LINES)
    if not all(isinstance(x, str) and len(x) <= 40 for x in value):
        raise BadReport(f"{where}.{name} must be batch ids")
    return tuple(value)


@dataclasses.dataclass(frozen=True, slots=True)
class LineResults:
    router: str
    results: tuple[Result, ...]
    #: Lines claimed and given back unrun (their batch stopped, or the router is stopping).
    released: tuple[tuple[str, int], ...] = ()
    #: The batches the router holds lines of now.
    holding: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"router": self.router, "results": [r.to_doc() for r in self.results],
                "released": [list(x) for x in self.released], "holding": list(self.holding)}

    @classmethod
    def from_doc(cls, doc: Any) -> LineResults:
        doc = _dict(doc, "results")
        return cls(_text(doc, "router", MAX_ROUTER_ID, where="results"),
                   tuple(Result.from_doc(x) for x in _list(doc, "results", "results", MAX_LINES)),
                   _pairs(doc, "released"), _names(doc, "holding", "results"))


@dataclasses.dataclass(frozen=True, slots=True)
class ResultsAck:
    written: int
    #: Of the batches held, those no longer running: their held lines are to be given back unrun.
    stopped: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"written": self.written, "stopped": list(self.stopped)}

    @classmethod
    def from_doc(cls, doc: Any) -> ResultsAck:
        doc = _dict(doc, "ack")
        return cls(_int(doc, "written", where="ack"), _names(doc, "stopped", "ack"))
