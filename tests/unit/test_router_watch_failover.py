"""A router following several control planes: it moves to the next one at once when the one it follows fails.

Each control plane here is a real aiohttp server on 127.0.0.1 serving ``/api/v1/endpoints`` with the long
poll of the real one (held while ``after`` equals its version), and taking ``/api/v1/router/events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from llmgw.core import skew
from llmgw.router import standalone, watch
from llmgw.router.settings import RouterSettings
from llmgw.router.table import TableHolder

#: How long a test waits for something that should take a round trip; a bound that fails a stall, not a timing.
WAIT_S = 10.0


def table(version: int, model: str) -> dict[str, Any]:
    return {"version": version, "models": [{"name": model, "served_name": model, "aliases": [], "state": "Ready",
                                            "endpoints": [{"replica_id": f"{model}-1", "url": "http://127.0.0.1:9",
                                                           "api_key": ""}]}]}


class ControlPlane:
    """One fake control plane; ``fail`` makes it answer 503 (``"5xx"``) or a body that is not a table."""

    def __init__(self, name: str, doc: dict[str, Any], asked: list[tuple[str, int]]) -> None:
        self.name = name
        self.doc = doc
        self.fail = ""  # "", "5xx" or "garbage"
        self.asked = asked  # (name, after) of every poll, shared by the control planes of a test, in order
        self.reports: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/v1/endpoints", self._endpoints)
        app.router.add_post("/api/v1/router/events", self._events)
        # A short shutdown: a stopped control plane drops the poll it holds instead of answering it.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        self.url = ""

    async def start(self) -> ControlPlane:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    def set_fail(self, how: str) -> None:
        self.fail = how
        self._wake.set()  # a held poll answers now, the way this control plane fails
        self._wake = asyncio.Event()  # and the next one is held again

    async def _endpoints(self, request: web.Request) -> web.StreamResponse:
        after = int(request.query["after"])
        self.asked.append((self.name, after))
        if not self.fail and after == self.doc["version"]:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), float(request.query["timeout"]))
        if self.fail == "5xx":
            return web.json_response({"error": {"message": "store unavailable"}}, status=503)
        if self.fail == "garbage":
            return web.Response(text="<html>a proxy's error page</html>", content_type="text/html")
        return web.json_response(self.doc, headers=skew.headers())

    async def _events(self, request: web.Request) -> web.Response:
        self.reports.append(await request.json())
        return web.json_response({"applied": len(self.reports[-1]["events"])})


@contextlib.asynccontextmanager
async def control_planes(*docs: dict[str, Any]) -> AsyncIterator[tuple[list[ControlPlane], list[tuple[str, int]]]]:
    asked: list[tuple[str, int]] = []
    planes: list[ControlPlane] = []
    try:
        for i, doc in enumerate(docs):
            planes.append(await ControlPlane("AB"[i], doc, asked).start())
        yield planes, asked
    finally:
        for plane in planes:
            await plane.stop()


async def until(test: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not test():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S:g} s"
        await asyncio.sleep(0.02)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the watcher logged about whom it follows (each installed table has its own line, left out)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.INFO and not r.getMessage().startswith("route table v")]


def serves(holder: TableHolder, model: str) -> bool:
    return holder.current.loaded and holder.current.lookup(model) is not None


@pytest.mark.parametrize("how", ["stopped", "5xx", "garbage"])
def test_the_first_failing_the_second_table_is_installed_at_once(how: str, caplog: pytest.LogCaptureFixture) -> None:
    """The followed control plane stops (or answers 503, or not a table): the next one's table is installed
    with no backoff, though it has the same version number, and one line says which it follows now."""
    caplog.set_level(logging.INFO, logger=watch.__name__)

    async def scenario() -> None:
        async with control_planes(table(1, "from-a"), table(1, "from-b")) as ((a, b), asked):
            holder = TableHolder()
            # A backoff of a minute: moving to B only after one would fail the wait below.
            watcher = watch.TableWatcher([a.url, b.url], holder, poll_timeout_s=30, backoff_min_s=60)
            await watcher.start()
            try:
                await until(lambda: serves(holder, "from-a"), "the first table")
                await until(lambda: asked[-1] == ("A", 1), "a poll held by A")
                assert watcher.current_url == a.url
                if how == "stopped":
                    await a.stop()
                else:
                    a.set_fail(how)
                # B's version is 1 too: asked after=1 it would hold the poll for 30 s with A's table in place.
                await until(lambda: serves(holder, "from-b"), "B's table")
                assert not serves(holder, "from-a")
                assert watcher.current_url == b.url
                assert [n for n in asked if n[0] == "B"][0] == ("B", -1)
                await until(lambda: asked[-1] == ("B", 1), "a poll held by B")
            finally:
                await watcher.stop()
            switched = said(caplog)
            assert len(switched) == 1 and switched[0].startswith(f"control plane {a.url} did not answer (")
            assert switched[0].endswith(f"; following {b.url}"), switched

    asyncio.run(scenario())


def test_backoff_after_a_whole_round_then_the_first_that_answers(caplog: pytest.LogCaptureFixture) -> None:
    """Both fail: they are asked in turn, the outage is logged once (not once per round), and the first one
    answering again is followed, its recovery logged."""
    caplog.set_level(logging.INFO, logger=watch.__name__)

    async def scenario() -> None:
        async with control_planes(table(3, "from-a"), table(8, "from-b")) as ((a, b), asked):
            a.set_fail("5xx")
            b.set_fail("garbage")
            holder = TableHolder()
            watcher = watch.TableWatcher([a.url, b.url], holder, poll_timeout_s=30, backoff_min_s=0.01,
                                         backoff_max_s=0.05)
            await watcher.start()
            try:
                await until(lambda: len(asked) >= 8, "four rounds")
                b.set_fail("")
                await until(lambda: serves(holder, "from-b"), "B's table once B answers")
                assert holder.current.version == 8 and watcher.current_url == b.url
            finally:
                await watcher.stop()
            names = [n for n, _ in asked]
            assert names[:8] == ["A", "B"] * 4, names  # never the same one twice in a row
            assert all(after == -1 for _, after in asked[:-1]), repr(asked)  # nothing known: each answers at once
            lines = said(caplog)
            assert len(lines) == 3, lines
            assert lines[0].startswith(f"control plane {a.url} did not answer (HTTP 503")
            assert lines[1].startswith(f"no control plane answers ({a.url}, {b.url}; last: ")
            assert lines[2].startswith(f"routes readable again from {b.url}/api/v1/endpoints after ")

    asyncio.run(scenario())


def test_one_url_keeps_its_old_meaning() -> None:
    """A single string is one control plane, as every caller gave it before; no URL at all is refused."""
    holder = TableHolder()
    watcher = watch.TableWatcher("http://127.0.0.1:1/", holder)
    assert watcher.current_url == "http://127.0.0.1:1"
    with pytest.raises(ValueError, match="no control-plane URL"):
        watch.TableWatcher([], holder)


def test_ejections_are_reported_to_the_control_plane_followed() -> None:
    """A standalone router's ejection reports go to the control plane its table comes from, not the first given."""

    async def scenario() -> None:
        async with control_planes(table(1, "from-a"), table(1, "from-b")) as ((a, b), asked):
            router = standalone.build(RouterSettings(control=(a.url, b.url), router_id="r1"))
            await router.startup()
            try:
                await until(lambda: serves(router.holder, "from-a"), "the first table")
                await a.stop()
                await until(lambda: serves(router.holder, "from-b"), "B's table")
                sink = router._events  # what the forwarder calls on an ejection
                assert sink is not None
                sink.ejected("from-b", "from-b-1", for_s=2.0, failures=3, reason="HTTP 503")
                await until(lambda: b.reports, "a report reaching B")
            finally:
                await router.shutdown()
            assert b.reports[0]["router"] == "r1"
            assert [e["replica"] for e in b.reports[0]["events"]] == ["from-b-1"]

    asyncio.run(scenario())


def test_control_flag_takes_a_comma_separated_list() -> None:
    """`--control` takes several URLs (spaces and trailing slashes tolerated, duplicates kept once)."""
    args = standalone.parse_args(["--control", "http://cp1:8080/, https://cp2.example:8443,http://cp1:8080"])
    assert args.control == ("http://cp1:8080", "https://cp2.example:8443")


@pytest.mark.parametrize("value, named", [
    ("http://cp1:8080,ftp://cp2:21", "'ftp://cp2:21'"),
    ("http://cp1:8080,cp2:8080", "'cp2:8080'"),
    ("http://cp1:8080,http://cp2:99999", "'http://cp2:99999'"),
    ("http://cp1:8080,,http://cp2:8080", "an empty URL"),
    ("http://:8080", "'http://:8080'"),
    ("http://cp1:8080?x=1", "'http://cp1:8080?x=1'"),
])
def test_router_refuses_a_malformed_list_naming_the_bad_url(value: str, named: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`llmgw router --control` with a bad URL in the list exits 2 with a message naming it and the form to use."""
    with pytest.raises(SystemExit) as exited:
        standalone.parse_args(["--control", value])  # what `llmgw router` and main() parse with
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --control" in err and named in err, err
    assert "comma-separated, e.g. http://cp1:8080,http://cp2:8080" in err
