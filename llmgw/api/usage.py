"""Usage and quota on the control plane <-> router wire (issue 26), as typed documents.

Two exchanges, each a router's POST with its router credential, answered by any control plane
(both write the database, so a failover loses nothing):

- ``POST /api/v1/router/usage``: a ``UsageBatch``, the metered requests of one router *journal*
  (a random id a router's journal file keeps for its life), numbered 1, 2, 3... in ``seq``. The control
  plane applies the records above the journal's mark and moves the mark in the same transaction, so a
  batch sent twice (a retry, a replay after ``kill -9``) is counted once. It answers ``UsageAck`` with
  the mark: what the router may forget.
- ``POST /api/v1/router/quota``: a ``QuotaSync``: per budget (``core.quota.budget_id``), what this
  router consumed of its lease since its last sync, what it gives back, and how much more it wants. The
  control plane answers ``QuotaAnswer``: per budget, what it granted, what the router now holds, the
  limit, what is charged, what remains free for everyone, and when the budget resets.

Strict reading on both sides: a bad field is ``BadReport`` naming it (422 at the control plane).
Unknown fields are ignored, so either side may be newer. Standard library only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from llmgw.api.reports import MAX_ROUTER_ID, BadReport

USAGE_PATH = "/api/v1/router/usage"
QUOTA_PATH = "/api/v1/router/quota"
#: More records than one batch may carry.
MAX_RECORDS_PER_BATCH = 5000
MAX_ITEMS_PER_SYNC = 5000
_MAX_COUNT = 10**15
_TEXT = {"project": 63, "key": 32, "user": 63, "model": 253, "node": 253, "replica": 253}


@dataclasses.dataclass(frozen=True, slots=True)
class UsageRecord:
    """One request as a router metered it."""

    seq: int  # 1, 2, 3... within the journal
    at: float  # when it arrived (epoch seconds)
    project: str = ""
    key: str = ""  # "": no key (a cluster without keys)
    user: str = ""
    model: str = ""
    node: str = ""
    replica: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    spend_micros: int = 0
    status: int = 0  # the HTTP status answered; 499: the client left
    ttft_ms: float = 0.0  # 0: no token came
    duration_ms: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, where: str, raw: Any) -> UsageRecord:
        if not isinstance(raw, Mapping):
            raise BadReport(f"{where}: expected an object")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = raw.get(f.name, f.default if f.name not in ("seq", "at") else None)
            if f.name in _TEXT:
                if not isinstance(value, str) or len(value) > _TEXT[f.name]:
                    raise BadReport(f"{where}.{f.name}: expected a string of at most {_TEXT[f.name]} characters")
            elif f.type in ("float",):
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                        or value < 0:
                    raise BadReport(f"{where}.{f.name}: expected a number >= 0, got {value!r}")
                value = float(value)
            elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_COUNT:
                raise BadReport(f"{where}.{f.name}: expected a whole number from 0 to {_MAX_COUNT}, got {value!r}")
            values[f.name] = value
        if values["seq"] < 1:
            raise BadReport(f"{where}.seq: expected 1 or more")
        return cls(**values)


class UsageRow(NamedTuple):
    """A ``UsageRecord`` as a tuple, the same fields in the same order: what a router's journal hands its
    in-process transport, made without a dataclass's ``__init__`` (``tuple.__new__(UsageRow, values)``: a
    microsecond less per request). Read like a ``UsageRecord`` (``r.seq``, ``r.prompt_tokens``...), and its
    ``to_doc`` is the same document. Never read from the wire: ``UsageRecord.from_doc`` is."""

    seq: int
    at: float
    project: str = ""
    key: str = ""
    user: str = ""
    model: str = ""
    node: str = ""
    replica: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    spend_micros: int = 0
    status: int = 0
    ttft_ms: float = 0.0
    duration_ms: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return dict(zip(RECORD_FIELDS, self, strict=True))


#: ``UsageRecord``'s (and ``UsageRow``'s) fields, in order: a record document's keys.
RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(UsageRecord))
assert RECORD_FIELDS == UsageRow._fields


@dataclasses.dataclass(frozen=True, slots=True)
class UsageBatch:
    router_id: str
    journal: str
    #: ``UsageRecord``s (read from a document), or ``UsageRow``s (a router's journal, in process).
    records: tuple[UsageRecord | UsageRow, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"router": self.router_id, "journal": self.journal, "records": [r.to_doc() for r in self.records]}

    @classmethod
    def from_doc(cls, doc: Any) -> UsageBatch:
        if isinstance(doc, UsageBatch):
            return doc
        if not isinstance(doc, Mapping):
            raise BadReport("usage batch: expected an object")
        router_id, journal = doc.get("router"), doc.get("journal")
        if not isinstance(router_id, str) or not 0 < len(router_id) <= MAX_ROUTER_ID:
            raise BadReport(f"router: expected the router's id, 1 to {MAX_ROUTER_ID} characters")
        if not isinstance(journal, str) or not 0 < len(journal) <= 64:
            raise BadReport("journal: expected the journal's id, 1 to 64 characters")
        raw = doc.get("records")
        if not isinstance(raw, list) or len(raw) > MAX_RECORDS_PER_BATCH:
            raise BadReport(f"records: expected a list of at most {MAX_RECORDS_PER_BATCH}")
        records = tuple(UsageRecord.from_doc(f"records[{i}]", r) for i, r in enumerate(raw))
        return cls(router_id, journal, records)


@dataclasses.dataclass(frozen=True, slots=True)
class UsageAck:
    journal: str
    applied_through: int  # every record with seq <= this is stored

    def to_doc(self) -> dict[str, Any]:
        return {"journal": self.journal, "applied_through": self.applied_through}

    @classmethod
    def from_doc(cls, doc: Any) -> UsageAck:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("journal"), str) \
                or not _count(doc.get("applied_through")):
            raise BadReport("usage ack: expected {journal, applied_through}")
        return cls(doc["journal"], doc["applied_through"])


@dataclasses.dataclass(frozen=True, slots=True)
class QuotaItem:
    """One budget, as a router tells it: consumed since its last sync, given back, wanted more."""

    budget: str
    consumed: int = 0
    returned: int = 0
    want: int = 0

    def to_doc(self) -> dict[str, Any]:
        return {"budget": self.budget, "consumed": self.consumed, "returned": self.returned, "want": self.want}


@dataclasses.dataclass(frozen=True, slots=True)
class QuotaSync:
    router_id: str
    items: tuple[QuotaItem, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"router": self.router_id, "items": [i.to_doc() for i in self.items]}

    @classmethod
    def from_doc(cls, doc: Any) -> QuotaSync:
        if isinstance(doc, QuotaSync):
            return doc
        if not isinstance(doc, Mapping):
            raise BadReport("quota sync: expected an object")
        router_id = doc.get("router")
        if not isinstance(router_id, str) or not 0 < len(router_id) <= MAX_ROUTER_ID:
            raise BadReport(f"router: expected the router's id, 1 to {MAX_ROUTER_ID} characters")
        raw = doc.get("items")
        if not isinstance(raw, list) or len(raw) > MAX_ITEMS_PER_SYNC:
            raise BadReport(f"items: expected a list of at most {MAX_ITEMS_PER_SYNC}")
        items = []
        for i, item in enumerate(raw):
            if not isinstance(item, Mapping) or not isinstance(item.get("budget"), str) \
                    or not 0 < len(item["budget"]) <= 400:
                raise BadReport(f"items[{i}].budget: expected a budget id (SCOPE/KIND/PERIOD)")
            counts = {}
            for name in ("consumed", "returned", "want"):
                value = item.get(name, 0)
                if not _count(value):
                    raise BadReport(f"items[{i}].{name}: expected a whole number from 0 to {_MAX_COUNT}, "
                                    f"got {value!r}")
                counts[name] = value
            items.append(QuotaItem(item["budget"], **counts))
        return cls(router_id, tuple(items))


@dataclasses.dataclass(frozen=True, slots=True)
class QuotaGrant:
    """One budget, as the control plane answers: what the router now holds and where the budget stands."""

    budget: str
    granted: int  # added to the router's lease by this sync
    held: int  # the router's lease after this sync
    limit: int  # 0: the budget is no longer in force (its limit was removed): admit freely
    charged: int  # consumed by everyone, as far as the control plane knows
    free: int  # neither charged nor held by any router
    reset_at: float  # when the period ends (inf for concurrency)

    def to_doc(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["reset_at"] = self.reset_at if math.isfinite(self.reset_at) else None
        return doc

    @classmethod
    def from_doc(cls, raw: Any) -> QuotaGrant:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("budget"), str):
            raise BadReport("quota grant: expected an object with a budget")
        counts = {n: raw.get(n) for n in ("granted", "held", "limit", "charged", "free")}
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise BadReport(f"quota grant {raw['budget']}.{name}: expected a whole number, got {value!r}")
        reset = raw.get("reset_at")
        reset_at = math.inf if reset is None else float(reset) if isinstance(reset, int | float) else None
        if reset_at is None:
            raise BadReport(f"quota grant {raw['budget']}.reset_at: expected seconds or null")
        return cls(raw["budget"], reset_at=reset_at, **counts)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True)
class QuotaAnswer:
    items: tuple[QuotaGrant, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        return {"items": [i.to_doc() for i in self.items]}

    @classmethod
    def from_doc(cls, doc: Any) -> QuotaAnswer:
        if isinstance(doc, QuotaAnswer):
            return doc
        if not isinstance(doc, Mapping) or not isinstance(doc.get("items"), list):
            raise BadReport("quota answer: expected {items: [...]}")
        return cls(tuple(QuotaGrant.from_doc(i) for i in doc["items"]))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT
