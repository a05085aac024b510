"""Telling the control plane, per model, what load this router sees: the autoscaler's signals.

Every ``interval_s`` (2 s), and at once when a request is held for a model at
zero or a model's admission queue forms, the ``Reporter`` sends one ``LoadReport``
(``llmgw.api.reports`` shows its JSON, the body ``POST /api/v1/router/signals`` takes).

``arrived``, ``ttft_counts`` (over ``core.autoscale.TTFT_BUCKETS_MS``, +inf last)
and ``tokens_out`` are deltas since the last report, reset when a report is
built, sent or not: a control plane that was down for a minute must not read the
minute's arrivals as one interval's (it would scale a model up for a burst that
ended long ago). ``waiting`` (admission's queue plus the requests held at zero),
``in_flight`` and ``replicas`` (what ``upstream`` counts per replica, at the
engines now) are gauges read when the report is built.

The hot path pays a few integer operations per request and nothing per chunk:
``arrived`` is a dict lookup and two stores, the first token one bisect into a
list, the output tokens one addition at the end (``metrics.Trace`` calls
``first_token`` and adds ``tokens``), an error one comparison there, and a
metered request's prompt tokens one addition (``completions``, once metered). No lock: the router is one event loop.

Sending never delays a request: reports are built and sent from the
reporter's own task, either to ``deliver`` (``llmgw server``: the control
plane's ``RouterSignals.record``, in process, the object itself) or POSTed with the router's
credential to the control plane it follows now (``control_url`` may be a
callable, the table watcher's ``current_url``, so reports follow a failover as
``reports.HttpSink`` does). Each send is bounded by ``timeout_s``; a failing
one is logged once when the failures start and once when they end, not every
interval.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import inspect
import logging
import ssl
import time
from collections.abc import Callable, Mapping

import aiohttp

from llmgw.api.routing import LoadReport, ModelLoad
from llmgw.core import autoscale, skew
from llmgw.core.background import Background
from llmgw.core.version import version
from llmgw.router import controltls
from llmgw.router.table import TableHolder

log = logging.getLogger(__name__)

SIGNALS_PATH = "/api/v1/router/signals"
_BOUNDS = autoscale.TTFT_BUCKETS_MS


def _none_queued(model: str) -> int:
    return 0


class ModelCounts:
    """One model's counters on the hot path: deltas since the last report, and the held gauge."""

    __slots__ = ("arrived", "ttft", "tokens_out", "last_arrival", "held", "errors", "tokens_in")

    def __init__(self) -> None:
        self.arrived = 0
        self.ttft = [0] * (len(_BOUNDS) + 1)
        self.tokens_out = 0
        self.last_arrival = 0.0  # perf_counter() of the newest arrival; 0: none since start
        self.held = 0  # requests held now because the model has no endpoint (a gauge, never reset)
        self.errors = 0  # answered 5xx since the last report (the UI's charts)
        self.tokens_in = 0  # metered requests' prompt tokens since the last report (the UI's charts)

    def first_token(self, seconds: float) -> None:
        """A first token ``seconds`` after the request's arrival."""
        self.ttft[bisect.bisect_left(_BOUNDS, seconds * 1000.0)] += 1


class Reporter:
    """Counts per model and reports to the control plane; ``start()``/``stop()`` run its sending task.

    ``deliver`` (in process) or ``control_url`` (a base URL, or a callable giving the one to use
    now) says where reports go; with neither, reports are only built (``report()``), for tests.
    ``attach`` (the app calls it) gives the reporter what it reads gauges from.
    """

    def __init__(self, router_id: str, *, deliver: Callable[[LoadReport], object] | None = None,
                 control_url: str | Callable[[], str] | None = None, headers: Mapping[str, str] | None = None,
                 interval_s: float = 2.0, timeout_s: float = 5.0, clock: Callable[[], float] = time.time,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.router_id = router_id
        #: Said in every report, so ``llmgw version`` lists this router's version beside the agents'.
        self._version, self._protocol = version(), skew.PROTOCOL
        self._ssl = ssl_context  # an https:// control plane's pinned CA (``controltls``); None: the system's
        self._deliver = deliver
        self._control_url = control_url
        self._headers = dict(headers or {})
        self.interval_s = interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self.counts: dict[str, ModelCounts] = {}
        self._holder: TableHolder | None = None
        self._in_flight: Mapping[str, int] = {}
        self._queued: Callable[[str], int] = _none_queued
        self._wake = asyncio.Event()
        self._task = Background("llmgw-router-signals")
        self._session: aiohttp.ClientSession | None = None
        self._failing = False  # the last send failed and that was logged: its end is logged too
        #: Reports the other side accepted, for tests and the log.
        self.sent = 0

    def attach(self, holder: TableHolder, *, in_flight: Mapping[str, int],
               queued: Callable[[str], int] = _none_queued) -> None:
        """Where the gauges come from: the table (each model's replicas), per-replica in flight, admission's queue."""
        self._holder = holder
        self._in_flight = in_flight
        self._queued = queued

    # --- the hot path ----------------------------------------------------------------------

    def arrived(self, model: str, at: float) -> ModelCounts:
        """A request for ``model`` arrived at ``at`` (perf_counter); its counters, for the request's trace."""
        counts = self.counts.get(model)
        if counts is None:
            counts = self.counts[model] = ModelCounts()
        counts.arrived += 1
        counts.last_arrival = at
        return counts

    def held(self, counts: ModelCounts) -> None:
        """A request is held for a model with no endpoint: counted as waiting, and reported at once (the wake)."""
        counts.held += 1
        self._wake.set()

    def queue_forming(self) -> None:
        """A request is about to wait in a model's empty admission queue: reported at once, as a hold is.

        The queue is what users feel first; reported up to an interval late, it delayed the
        scale-up of a spike by that much (bench/autoscale.py). Called only when a queue goes
        from empty to one waiter, so a queue that stays long sends nothing more than the interval's.
        """
        self._wake.set()

    def released(self, counts: ModelCounts) -> None:
        """A held request got its endpoint, or gave up."""
        counts.held -= 1

    # --- reports -----------------------------------------------------------------------------

    def url(self) -> str:
        """Where the next report is POSTed: read before each send, so a send follows the watcher's switch."""
        if self._control_url is None:
            return ""
        base = self._control_url if isinstance(self._control_url, str) else self._control_url()
        return base.rstrip("/") + SIGNALS_PATH

    def report(self) -> LoadReport:
        """The report of now; the deltas it carries are reset (see the module's docstring for why)."""
        wall, perf = self._clock(), time.perf_counter()
        routes = {m.name: m for m in self._holder.current.models} if self._holder is not None else {}
        models = []
        for name in dict.fromkeys((*routes, *self.counts)):
            route = routes.get(name)
            replicas = ({e.replica_id: self._in_flight.get(e.replica_id, 0) for e in route.endpoints}
                        if route is not None else {})
            in_flight = sum(replicas.values())
            counts = self.counts.get(name)
            held = counts.held if counts is not None else 0
            waiting = self._queued(name) + held
            if counts is None or not (counts.arrived or counts.tokens_out or counts.errors or any(counts.ttft)):
                if not (in_flight or waiting):
                    continue  # nothing to say: a quiet model is left out
            entry = ModelLoad(model=name, waiting=waiting, in_flight=in_flight, held=held, replicas=replicas)
            if counts is not None:
                entry = dataclasses.replace(
                    entry, arrived=counts.arrived, ttft_counts=tuple(counts.ttft), tokens_out=counts.tokens_out,
                    errors=counts.errors, tokens_in=counts.tokens_in,
                    last_request_at=round(wall - (perf - counts.last_arrival), 3) if counts.last_arrival else 0.0)
                counts.arrived, counts.ttft, counts.tokens_out = 0, [0] * (len(_BOUNDS) + 1), 0
                counts.errors = counts.tokens_in = 0
            models.append(entry)
        return LoadReport(router=self.router_id, interval_s=self.interval_s, sent_at=wall, models=tuple(models),
                          version=self._version, protocol=self._protocol)

    async def flush(self) -> bool:
        """Build a report and send it now; False (logged once while it lasts) when it did not arrive."""
        report = self.report()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._send(report)
        except Exception as exc:  # a bug or an outage on the other side must never reach a request
            if not self._failing:
                self._failing = True
                where = self.url() or "the control plane"
                log.warning("cannot report load signals to %s: %s; the autoscaler sees this router's load only "
                            "when it is back (retrying every %gs, not logged again until it works)", where,
                            str(exc) or type(exc).__name__, self.interval_s)
            return False
        if self._failing:
            self._failing = False
            log.info("load signals reach %s again", self.url() or "the control plane")
        self.sent += 1
        return True

    async def _send(self, report: LoadReport) -> None:
        if self._deliver is not None:
            result = self._deliver(report)
            if inspect.isawaitable(result):
                await result
            return
        url = self.url()
        if not url:
            return
        if self._session is None:
            self._session = controltls.session(self._ssl)
        async with self._session.post(url, json=report.to_doc(), headers=self._headers) as resp:
            if resp.status in (401, 403):
                raise _Refused(f"HTTP {resp.status}: the control plane refused this router's credential; give it "
                               "one with `llmgw router-token create NAME` and `--token-file FILE` "
                               "(or LLMGW_ROUTER_TOKEN)")
            if resp.status >= 400:
                raise _Refused(f"HTTP {resp.status}: {(await resp.text(errors='replace'))[:200]}")

    # --- the sending task ------------------------------------------------------------------

    async def start(self) -> None:
        self._task.start(self._run)

    async def stop(self) -> None:
        await self._task.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            # A held request sets _wake: its model at zero is reported at once, not up to an interval later.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            await self.flush()


class _Refused(Exception):
    pass
