"""A short, bounded history of one subject's numbers: fixed rings of time buckets, at two resolutions.

One job: keep numbers by time in memory of a size known in advance, and give them back by bucket. What
the numbers are (a model's requests, a node's memory) is the caller's (``llmgw.control.history``).

A ``Series`` has named fields, each a kind:

* ``SUM``: a count since the last record (requests, tokens, a TTFT bucket's count). A bucket holds the sum
  of what was added in it; a rate is that over the bucket's step.
* ``MEAN``: a gauge read now (in flight, memory used). A bucket holds the mean of what was recorded in it.

and a ``Tier`` per resolution (by default 1 h at 10 s and 24 h at 1 min). Every record goes into every
tier at once, each into the bucket of its own step that holds the record's time: a coarse bucket is the
sum (or mean) of exactly the records a fine one would have seen over the same minute, with no rounding
of a rounding (downsampling by aggregation, not by resampling). A tier is a ring: bucket ``k`` (the
record's time // step) lives in slot ``k % slots`` and remembers ``k``, so a slot still holding an older
bucket reads as a gap (None), never as the old value; nothing is ever freed or grown.

Memory, fixed at creation: each slot holds one float32 per field, one uint32 count per ``MEAN`` field and
the bucket's number (int64): ``slots × (4 × fields + 4 × means + 8)`` bytes per tier, plus ~1 KiB of
Python objects. For a model's 26 fields (6 of them means) at 360 + 1440 slots: 1800 × (104 + 24 + 8) =
244,800 bytes, ~240 KiB (``nbytes()`` says it; ``bench/history.py`` measures it). float32 keeps a
count exact to 2^24 (16.7 M) per bucket and a larger one within 1 part in 10^7.

Pure: standard library only, the clock passed in.
"""

from __future__ import annotations

import array
import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence

__all__ = ["DEFAULT_TIERS", "Field", "Kind", "Series", "Tier"]


class Kind(enum.Enum):
    SUM = "sum"
    MEAN = "mean"


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: Kind = Kind.MEAN


@dataclasses.dataclass(frozen=True, slots=True)
class Tier:
    """A resolution: buckets of ``step_s`` seconds, ``slots`` of them (the span: ``step_s × slots``)."""

    step_s: int
    slots: int

    @property
    def span_s(self) -> int:
        return self.step_s * self.slots


#: 1 h at 10 s, then 24 h at 1 min.
DEFAULT_TIERS = (Tier(10, 360), Tier(60, 1440))


class _Ring:
    __slots__ = ("tier", "bucket", "sums", "counts", "nfields", "nmeans")

    def __init__(self, tier: Tier, nfields: int, nmeans: int) -> None:
        self.tier, self.nfields, self.nmeans = tier, nfields, nmeans
        self.bucket = array.array("q", [-1]) * tier.slots  # the bucket number a slot holds; -1: none yet
        self.sums = array.array("f", [0.0]) * (tier.slots * nfields)
        self.counts = array.array("I", [0]) * (tier.slots * max(nmeans, 1))

    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self.bucket, self.sums, self.counts))

    def slot(self, k: int) -> int:
        """The slot bucket ``k`` lives in, emptied first when it held an older bucket."""
        i = k % self.tier.slots
        if self.bucket[i] != k:
            self.bucket[i] = k
            base, cbase = i * self.nfields, i * self.nmeans
            for j in range(self.nfields):
                self.sums[base + j] = 0.0
            for j in range(self.nmeans):
                self.counts[cbase + j] = 0
        return i


class Series:
    """One subject's fields over time, in every tier of ``tiers`` (finest first)."""

    def __init__(self, fields: Sequence[Field], tiers: Sequence[Tier] = DEFAULT_TIERS) -> None:
        if not fields:
            raise ValueError("a series needs at least one field")
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"field names repeat: {names}")
        if not tiers or any(t.step_s <= 0 or t.slots <= 0 for t in tiers):
            raise ValueError("each tier needs step_s > 0 and slots > 0")
        self.fields = tuple(fields)
        self.tiers = tuple(sorted(tiers, key=lambda t: t.step_s))
        self._index = {f.name: i for i, f in enumerate(self.fields)}
        means = [i for i, f in enumerate(self.fields) if f.kind is Kind.MEAN]
        self._mean_of = {i: k for k, i in enumerate(means)}  # field index -> its place among the means
        self._rings = tuple(_Ring(t, len(self.fields), len(means)) for t in self.tiers)
        self.last_at = -math.inf  # the newest record's time

    def nbytes(self) -> int:
        """The bytes its buckets hold (fixed at creation)."""
        return sum(r.nbytes() for r in self._rings)

    def record(self, at: float, values: Mapping[str, float]) -> None:
        """Adds ``values`` (by field name; an unknown name raises KeyError) at time ``at`` to every tier.

        A record older than a tier's span (a late report) is dropped by that tier; a non-finite value is
        skipped. Recording an empty mapping still marks the buckets as seen (a known 0, not a gap)."""
        if not math.isfinite(at) or at < 0:
            return
        self.last_at = max(self.last_at, at)
        items = []
        for name, v in values.items():
            j, x = self._index[name], float(v)
            if math.isfinite(x):
                items.append((j, x, self._mean_of.get(j)))
        for ring in self._rings:
            step, slots = ring.tier.step_s, ring.tier.slots
            k = int(at // step)
            if k <= int(self.last_at // step) - slots:
                continue  # older than the ring reaches: its slot now holds a newer bucket
            i = ring.slot(k)
            base, cbase, sums, counts = i * ring.nfields, i * ring.nmeans, ring.sums, ring.counts
            for j, x, m in items:
                sums[base + j] += x
                if m is not None:
                    counts[cbase + m] += 1

    def tier_for(self, window_s: float) -> Tier:
        """The finest tier whose span covers ``window_s`` (the coarsest when none does)."""
        for t in self.tiers:
            if t.span_s >= window_s:
                return t
        return self.tiers[-1]

    def read(self, now: float, window_s: float,
             names: Sequence[str] | None = None) -> tuple[Tier, list[tuple[int, tuple[float | None, ...] | None]]]:
        """The buckets over the last ``window_s`` up to ``now``, oldest first, in the finest tier that covers it.

        Each is ``(bucket start, row)``: ``row`` None for a gap (nothing recorded in that bucket), else a
        value per name of ``names`` (every field by default): a ``SUM`` field's sum, a ``MEAN`` field's
        mean, or None for a mean with no sample there. The buckets run to the one holding ``now``."""
        tier = self.tier_for(window_s)
        ring = self._rings[self.tiers.index(tier)]
        idx = [self._index[n] for n in (names if names is not None else [f.name for f in self.fields])]
        last = int(now // tier.step_s)
        count = max(1, min(tier.slots, math.ceil(window_s / tier.step_s)))
        out: list[tuple[int, tuple[float | None, ...] | None]] = []
        cols = [(j, self._mean_of.get(j)) for j in idx]
        sums, counts, buckets, nfields, nmeans, slots = (ring.sums, ring.counts, ring.bucket, ring.nfields,
                                                         ring.nmeans, tier.slots)
        for k in range(last - count + 1, last + 1):
            i = k % slots
            if k < 0 or buckets[i] != k:
                out.append((k * tier.step_s, None))
                continue
            base, cbase = i * nfields, i * nmeans
            row = tuple(sums[base + j] if m is None else
                        (sums[base + j] / counts[cbase + m] if counts[cbase + m] else None) for j, m in cols)
            out.append((k * tier.step_s, row))
        return tier, out
