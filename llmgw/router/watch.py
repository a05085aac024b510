"""Keeping the route table current: a long poll on the control plane's endpoints document.

``TableWatcher`` asks ``GET {control}/api/v1/endpoints?after=V&timeout=T``; the
control plane answers at once when its version is not ``V`` and otherwise holds
the request up to ``T`` seconds. Each answer becomes a new ``RouteTable`` swapped
into the holder, so a replica that turns Ready takes traffic within one round
trip rather than one polling interval.

When the control plane cannot be reached, or answers with something that is not
a table, the watcher keeps the last table and retries with capped, jittered
backoff: engines are reached directly, so the router keeps serving while the
control plane restarts (and a fleet of routers does not retry in lock step). One
line is logged when an outage starts and one when it ends, not one per retry.

Inside ``llmgw server`` the router follows the control plane of its own process with a
``LocalWatcher``: the same long poll as a call (``Cluster.wait_table``), the table as an object.

Several control planes (``control_urls``, one leader and its standbys, each serving
the same table from the database) are followed one at a time. A failed poll moves
the watcher to the next URL for the very next poll, so losing the one it follows costs
one round trip, not a backoff; the backoff starts only once every URL of a round has
failed. Each switch forgets the version: versions are counted per control plane, and
the new one's "v1" says nothing about the old one's, so asking it ``after=1`` could
hold the poll for a whole timeout with a stale table in place.

A secure control plane serves the table only to routers with their own credential
(``headers`` carries ``Authorization: Bearer``); a 401 or 403 is logged saying how
to give the router one, and retried like an outage (a token made later is read on
the router's next start).

The skew policy (``core.skew``): each poll says the router's protocol and version
(``X-Llmgw-Protocol``, ``X-Llmgw-Version``); a control plane that refuses them answers 409
with the sentence, and one that answers says its own, which the router checks in turn (none:
a control plane before 0.2.0, protocol 1, too old for this router). Either way the router
keeps its last table, logs the sentence at ERROR once for the outage, and polls on with the
backoff: the control plane may be upgraded in a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp

from llmgw.api import routing, tunnel
from llmgw.core import skew
from llmgw.core.background import Background
from llmgw.core.version import version
from llmgw.router import controltls
from llmgw.router.auth import ListenGuard
from llmgw.router.table import RouteTable, TableError, TableHolder

log = logging.getLogger(__name__)


class _PollFailed(Exception):
    pass


class _Skew(_PollFailed):
    """The control plane and this router are outside the skew policy; the message is the sentence."""


def parse_control_urls(value: str) -> tuple[str, ...]:
    """``URL[,URL...]`` as given to ``--control``: each an http(s) base URL; ValueError naming the bad one.

    Duplicates are kept once, in the order given (trailing slashes do not make a URL new).
    """
    urls: list[str] = []
    for item in value.split(","):
        url = item.strip().rstrip("/")
        _check_control_url(url, given=value)
        if url not in urls:
            urls.append(url)
    return tuple(urls)


def _check_control_url(url: str, *, given: str) -> None:
    hint = "give each control plane's base URL, comma-separated, e.g. http://cp1:8080,http://cp2:8080"
    if not url:
        raise ValueError(f"an empty URL in {given!r}; {hint}")
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port  # ValueError on a port that is not a number in 0-65535
    except ValueError:
        port = -1
    if (parts.scheme not in ("http", "https") or not parts.hostname or port in (-1, 0) or parts.query
            or parts.fragment or any(c.isspace() for c in url) or len(url) > 2000):
        # A URL that only looks right (ftp://, a missing host, cp1:8080 without a scheme) would
        # otherwise fail every poll later, logged as an outage rather than refused at the start.
        raise ValueError(f"{url!r} is not an http(s) URL of a control plane; {hint}")


class _Follower:
    """What every watcher does with a table it read: swap it in when it changed, check the listen, say it is loaded."""

    def __init__(self, holder: TableHolder, listen_guard: ListenGuard | None) -> None:
        self._holder = holder
        self._guard = listen_guard  # warns when a table leaves a non-loopback listen without keys
        self._loaded = asyncio.Event()

    async def wait_loaded(self, timeout: float) -> bool:
        """True once a first table has been installed, False if ``timeout`` passes first."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._loaded.wait(), timeout)
        return self._loaded.is_set()

    def _install(self, table: RouteTable) -> None:
        old = self._holder.current
        if table != old:
            self._holder.swap(table)
            log.info("route table v%d: %d models, %d endpoints (was v%d: %d models, %d endpoints)",
                     table.version, len(table.models), table.endpoint_count(),
                     old.version, len(old.models), old.endpoint_count())
        if self._guard is not None:
            self._guard.check(table.auth)
        self._loaded.set()


class TableWatcher(_Follower):
    """Long-polls one of ``control_urls`` and swaps each new table into ``holder``."""

    def __init__(self, control_urls: str | Sequence[str], holder: TableHolder, *,
                 session: aiohttp.ClientSession | None = None,
                 poll_timeout_s: float = 30.0, backoff_min_s: float = 0.2, backoff_max_s: float = 5.0,
                 headers: Mapping[str, str] | None = None, listen_guard: ListenGuard | None = None,
                 ssl_context: ssl.SSLContext | None = None, protocol: int = skew.PROTOCOL,
                 router_version: str | None = None) -> None:
        """``ssl_context``: an https:// control plane's pinned CA (``controltls``); None: the system's.
        ``protocol``/``router_version``: what this router says it is (``core.skew``): this release's but in tests."""
        # One string is one URL, as before several were followed (never split on commas here:
        # parse_control_urls is for what a person typed).
        urls = [control_urls] if isinstance(control_urls, str) else list(control_urls)
        if not urls:
            raise ValueError("no control-plane URL to follow; give at least one")
        super().__init__(holder, listen_guard)
        self._urls = tuple(dict.fromkeys(u.rstrip("/") for u in urls))
        self._following = _Following(len(self._urls))
        self._session = session
        self._own_session = session is None
        self._ssl = ssl_context
        self._poll_timeout_s = poll_timeout_s
        self._backoff_min_s = backoff_min_s
        self._backoff_max_s = backoff_max_s
        self._protocol = protocol
        self._version = version() if router_version is None else router_version
        self._headers = {**skew.headers(protocol, self._version), **(headers or {})}
        self._after = -1  # no version yet: the first poll answers at once
        self._task = Background("llmgw-router-table-watch")
        #: Each control plane's tunnel port, as its answers say (``api.tunnel.PORT_HEADER``; issue 33).
        self.tunnel_ports: dict[str, int] = {}

    async def start(self) -> None:
        if self._task.running:
            return
        if self._session is None:
            self._session = controltls.session(self._ssl)
        self._task.start(self._run)

    async def stop(self) -> None:
        """Cancel the poll in flight and return; the holder keeps the last table."""
        await self._task.stop()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def current_url(self) -> str:
        """The base URL of the control plane followed now (the next poll goes there)."""
        return self._urls[self._following.index]

    async def _run(self) -> None:
        backoff = self._backoff_min_s
        outage_since: float | None = None
        told = False  # the outage has been logged as one (not merely as a switch): its end is logged too
        skew_told: set[str] = set()  # the skew refusals logged at ERROR in this outage: not again while it lasts
        while True:
            asked = self.current_url
            try:
                table = RouteTable.from_doc(await self._poll(asked))
            except (aiohttp.ClientError, TimeoutError, ValueError, TableError, _PollFailed) as exc:
                reason = str(exc) or type(exc).__name__
                # Versions are per control plane: the next one's v1 is not this one's, and
                # asking it after=1 would hold the poll a whole timeout with a stale table.
                self._after = -1
                round_failed = self._following.failed()
                first = outage_since is None
                if first:
                    outage_since = time.monotonic()
                if isinstance(exc, _Skew):
                    if reason not in skew_told:  # once an outage (per sentence), not once per poll
                        skew_told.add(reason)
                        told = True
                        log.error("control plane %s and this router do not work together: %s; %s, polling again "
                                  "until one of them is upgraded", asked, reason, self._keeping())
                    else:
                        log.debug("control plane %s: still outside the skew policy", asked)
                elif first:
                    if len(self._urls) > 1:
                        log.warning("control plane %s did not answer (%s); following %s", asked, reason,
                                    self.current_url)
                    else:
                        log.warning("cannot read routes from %s: %s; %s, retrying", self._endpoints(asked),
                                    reason, self._keeping())
                        told = True
                elif round_failed and not told:
                    log.warning("no control plane answers (%s; last: %s); %s, retrying", ", ".join(self._urls),
                                reason, self._keeping())
                    told = True
                else:
                    log.debug("control plane %s did not answer (%s); following %s", asked, reason,
                              self.current_url)
                if round_failed:
                    await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                    backoff = min(backoff * 2, self._backoff_max_s)
                continue
            self._following.answered()
            if outage_since is not None and told:
                log.info("routes readable again from %s after %.1fs", self._endpoints(asked),
                         time.monotonic() - outage_since)
            outage_since, told, skew_told = None, False, set()
            backoff = self._backoff_min_s
            unchanged = table.version == self._after
            self._after = table.version
            self._install(table)
            if unchanged:
                # A control plane that answers at once without a change (no long-poll
                # support) would otherwise be asked again in a tight loop.
                await asyncio.sleep(self._backoff_min_s)

    def _keeping(self) -> str:
        return _keeping(self._holder)

    @staticmethod
    def _endpoints(base_url: str) -> str:
        return base_url + "/api/v1/endpoints"

    async def _poll(self, base_url: str) -> object:
        assert self._session is not None
        params = {"after": str(self._after), "timeout": f"{self._poll_timeout_s:g}"}
        timeout = aiohttp.ClientTimeout(total=self._poll_timeout_s + 10.0)
        async with self._session.get(self._endpoints(base_url), params=params, headers=self._headers,
                                     timeout=timeout) as resp:
            if resp.status == 409 and (refusal := await _skew_refusal(resp)):
                raise _Skew(refusal)
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:200]
                if resp.status in (401, 403):
                    given = "a router token" if "authorization" in {k.lower() for k in self._headers} else "no token"
                    raise _PollFailed(f"the control plane refused {given} (HTTP {resp.status}: {text}); make one with "
                                      "`llmgw router-token create NAME` and start the router with `--token-file "
                                      "FILE` (or LLMGW_ROUTER_TOKEN)")
                raise _PollFailed(f"HTTP {resp.status}: {text}")
            doc = await resp.json(content_type=None)  # first: a proxy's error page is not a control plane's answer
            refusal = skew.server_refusal("router", skew.parse_header(resp.headers.get(skew.PROTOCOL_HEADER)),
                                          resp.headers.get(skew.VERSION_HEADER, "")[:64], own_protocol=self._protocol,
                                          own_version=self._version)
            if refusal:  # a control plane too old for this router (one before 0.2.0 says no protocol)
                raise _Skew(refusal)
            said = resp.headers.get(tunnel.PORT_HEADER, "")
            if said.isdigit():
                self.tunnel_ports[base_url] = int(said)
            return doc


async def _skew_refusal(resp: aiohttp.ClientResponse) -> str:
    """The sentence of a control plane's 409 refusing this router for the skew ("" for another 409)."""
    try:
        error = (await resp.json(content_type=None)).get("error") or {}
    except (ValueError, AttributeError, aiohttp.ClientError):
        return ""
    if not isinstance(error, dict) or error.get("code") != skew.REFUSAL_CODE:
        return ""
    return str(error.get("message") or "")[:500]


class LocalWatcher(_Follower):
    """Follows a control plane in the same process: ``wait(after=V, timeout=T)`` is its long poll.

    ``Cluster.wait_table`` is one: it answers the table (an ``EndpointsDoc``, or its JSON dict) at once
    when its version is not ``V``, else within ``T`` seconds. No HTTP, no JSON, no credential: inside
    ``llmgw server`` the router reads the object the control plane published. A table it cannot read
    (or a wait that fails) keeps the last one and is tried again after ``retry_s``.
    """

    def __init__(self, wait: Callable[..., Awaitable[routing.EndpointsDoc | Mapping[str, Any]]], holder: TableHolder,
                 *, poll_timeout_s: float = 30.0, retry_s: float = 1.0,
                 listen_guard: ListenGuard | None = None) -> None:
        super().__init__(holder, listen_guard)
        self._wait = wait
        self._poll_timeout_s = poll_timeout_s
        self._retry_s = retry_s
        self._task = Background("llmgw-router-table-local")

    async def start(self) -> None:
        self._task.start(self._run)

    async def stop(self) -> None:
        """Cancel the wait in flight and return; the holder keeps the last table."""
        await self._task.stop()

    async def _run(self) -> None:
        after = -1
        failing = False  # logged once when it starts failing, once when it reads again
        while True:
            try:
                table = RouteTable.from_doc(await self._wait(after=after, timeout=self._poll_timeout_s))
            except Exception as exc:  # a bug or a bad table here must not end routing for the process's life
                if not failing:
                    failing = True
                    log.warning("cannot read routes from the control plane in this process: %s; %s, retrying",
                                str(exc) or type(exc).__name__, _keeping(self._holder))
                await asyncio.sleep(self._retry_s)
                continue
            if failing:
                failing = False
                log.info("routes readable again from the control plane in this process")
            unchanged = table.version == after
            after = table.version
            self._install(table)
            if unchanged:  # a wait that answers at once without a change: not a tight loop
                await asyncio.sleep(self._retry_s)


def _keeping(holder: TableHolder) -> str:
    current = holder.current
    return (f"serving the last table (v{current.version})" if current.loaded
            else "no table yet, answering 503 until one arrives")


class _Following:
    """Which of ``count`` control planes the watcher asks, and when a whole round of them has failed.

    Plain state, no I/O: the watcher asks ``index``, then reports ``answered()`` or ``failed()``.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self.index = 0
        self._failed_in_a_row = 0

    def failed(self) -> bool:
        """Move to the next control plane; True when every one has now failed in a row (time to back off)."""
        self._failed_in_a_row += 1
        self.index = (self.index + 1) % self.count
        return self._failed_in_a_row % self.count == 0

    def answered(self) -> None:
        self._failed_in_a_row = 0
