"""The router's traffic as the overview shows it: request rate, TTFT p50/p99 and errors, per model and in all.

Read from the router's own metrics over the API (``GET /metrics?name[]=…``: in ``llmgw server`` the
control plane serves the in-process router's registry there), never from the router's objects: the
control plane and the router meet only on the wire. A counter is a total since the router started,
so a rate needs two reads: ``Sampler`` keeps this process's reads of the last minute (one a second at
most, whoever asked) and compares the newest with the oldest. Quantiles come from the TTFT
histogram's bucket counts gained in that window, interpolated within a bucket as Prometheus'
``histogram_quantile`` does. Parsing and comparing are pure; the UI's page does the one read.

Only this server's router is counted: a standalone ``llmgw router`` serves its own ``/metrics``,
which a Prometheus scrapes; the control plane does not gather them.
"""

from __future__ import annotations

import collections
import dataclasses
import math

from prometheus_client import parser

REQUESTS = "llmgw_router_requests_total"
TTFT_BUCKET = "llmgw_router_time_to_first_token_seconds_bucket"
#: The query that asks ``/metrics`` for these two series only (the whole scrape also counts replicas).
QUERY = (("name[]", REQUESTS), ("name[]", TTFT_BUCKET))
#: How far back a rate and the quantiles look.
WINDOW_S = 60.0
#: Reads closer together than this are compared but not kept: ten open overviews keep one a second.
KEEP_EVERY_S = 1.0
#: The router counts a request for a model it does not know under ``model=""``.
UNKNOWN = "(unknown model)"


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """One read of the router's counters: by model, requests and errors (status 400 and above) since it
    started, and the TTFT histogram's cumulative counts by upper bound (``math.inf`` last)."""

    at: float
    requests: dict[str, int]
    errors: dict[str, int]
    ttft: dict[str, dict[float, float]]


def parse(text: str, *, at: float) -> Sample:
    """The counters in a Prometheus text body; series other than the two read here are ignored."""
    requests: dict[str, int] = {}
    errors: dict[str, int] = {}
    ttft: dict[str, dict[float, float]] = {}
    for family in parser.text_string_to_metric_families(text):
        for s in family.samples:
            model = s.labels.get("model", "") or UNKNOWN
            if s.name == REQUESTS:
                requests[model] = requests.get(model, 0) + int(s.value)
                if _is_error(s.labels.get("code", "")):
                    errors[model] = errors.get(model, 0) + int(s.value)
            elif s.name == TTFT_BUCKET:
                ttft.setdefault(model, {})[float(s.labels.get("le", "+Inf"))] = s.value
    return Sample(at, requests, errors, ttft)


def _is_error(code: str) -> bool:
    return code.isdigit() and int(code) >= 400


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One model's (or every model's) traffic over the window; a quantile is None without a streamed request."""

    model: str
    requests: int
    errors: int
    rate_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class Traffic:
    """What the overview shows: the rows over ``window_s`` seconds (None: one read so far, no rate yet),
    and how many requests the router has answered since it started."""

    window_s: float | None
    rows: tuple[Row, ...]
    total: Row
    ever: int


def _gained(new: float, old: float) -> float:
    # Less than before: the router restarted and its counter began again at 0.
    return new - old if new >= old else new


def quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """The ``q`` quantile of a histogram's cumulative bucket counts, as ``histogram_quantile`` gives it:
    linear within its bucket; in the +Inf bucket, the largest finite bound. None for an empty one."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = cumulative[bound]
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = (bound if not math.isinf(bound) else lower), count
    return lower


def compare(old: Sample | None, new: Sample) -> Traffic:
    """The traffic between two reads (``old`` None: the first read, with no rate and no window)."""
    base = old or Sample(new.at, {}, {}, {})
    span = new.at - base.at
    models = sorted(set(new.requests) | set(new.ttft), key=lambda m: (m == UNKNOWN, m))  # the unknown one last
    rows, every_ttft = [], dict[float, float]()
    for model in models:
        was = base.ttft.get(model, {})
        gained_ttft = {b: _gained(c, was.get(b, 0.0)) for b, c in new.ttft.get(model, {}).items()}
        for b, c in gained_ttft.items():
            every_ttft[b] = every_ttft.get(b, 0.0) + c
        rows.append(_row(model, _gained(new.requests.get(model, 0), base.requests.get(model, 0)),
                         _gained(new.errors.get(model, 0), base.errors.get(model, 0)), span, gained_ttft))
    total = _row("all models", sum(r.requests for r in rows), sum(r.errors for r in rows), span, every_ttft)
    return Traffic(span if old is not None else None, tuple(rows), total, sum(new.requests.values()))


def _row(model: str, requests: int, errors: int, span: float, ttft: dict[float, float]) -> Row:
    return Row(model, requests, errors, requests / span if span > 0 else 0.0, quantile(0.5, ttft),
               quantile(0.99, ttft))


class Sampler:
    """This process's reads of the last ``window_s`` seconds, the newest compared with the oldest."""

    def __init__(self, *, window_s: float = WINDOW_S, keep_every_s: float = KEEP_EVERY_S) -> None:
        self.window_s, self.keep_every_s = window_s, keep_every_s
        self._kept: collections.deque[Sample] = collections.deque()

    def add(self, sample: Sample) -> Traffic:
        """The traffic from the oldest read kept (at most ``window_s`` old, or the one just before) to ``sample``."""
        kept = self._kept
        if not kept or sample.at - kept[-1].at >= self.keep_every_s:
            kept.append(sample)
        # The oldest kept is the newest one at least a window old: the window is full, never more than a read over.
        while len(kept) >= 2 and kept[1].at <= sample.at - self.window_s:
            kept.popleft()
        base = kept[0] if kept[0] is not sample else None
        return compare(base, sample)
