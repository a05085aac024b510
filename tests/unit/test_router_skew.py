"""The router's side of the skew policy (``core.skew``) on its table request, against a real HTTP control plane on
127.0.0.1 (``fakecontrol.RouterControl``) acting as one of another release: each poll says the router's protocol
and version; an answer without a protocol (a control plane before 0.2.0) or from one too new for the router is
refused: the last table is kept, the sentence logged at ERROR once for the outage, and polling goes on, so the
table comes back once the control plane is one the router works with."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from llmgw.core import skew
from llmgw.router import watch
from llmgw.router.table import TableHolder
from llmgw.testing.fakecontrol import RouterControl

WAIT_S = 20.0


def _doc(version: int) -> dict[str, object]:
    return {"version": version, "models": [{"name": f"m{version}", "state": "Ready",
                                            "endpoints": [{"replica_id": "r-1", "url": "http://127.0.0.1:9"}]}]}


async def _until(test: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not test():
        assert time.monotonic() < deadline, f"{what} did not happen within {WAIT_S:g} s"
        await asyncio.sleep(0.02)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == watch.__name__]


def test_each_poll_says_the_routers_protocol_and_version() -> None:
    control = RouterControl(_doc(1)).start()
    try:
        async def run() -> None:
            holder = TableHolder()
            watcher = watch.TableWatcher(control.url, holder, router_version="0.2.0")
            await watcher.start()
            try:
                assert await watcher.wait_loaded(WAIT_S)
            finally:
                await watcher.stop()

        asyncio.run(run())
        assert control.routers_said[0] == (str(skew.PROTOCOL), "0.2.0")
    finally:
        control.close()


@pytest.mark.parametrize("acting_as", ["0.1.0", "two protocols newer"])
def test_a_control_plane_outside_the_policy_keeps_the_last_table(caplog: pytest.LogCaptureFixture,
                                                                 acting_as: str) -> None:
    """The control plane is replaced by one outside the policy (0.1.0, which says no protocol; or one the router is
    too old for): its new table is not installed, the router serves the last one, says why at ERROR once over many
    polls, and takes the table again once the control plane is one it works with."""
    control = RouterControl(_doc(1)).start()
    try:
        async def run() -> None:
            holder = TableHolder()
            watcher = watch.TableWatcher(control.url, holder, router_version="0.2.0", backoff_min_s=0.01,
                                         backoff_max_s=0.02)
            await watcher.start()
            try:
                assert await watcher.wait_loaded(WAIT_S)
                with caplog.at_level(logging.DEBUG, logger=watch.__name__):
                    control.said = {} if acting_as == "0.1.0" else skew.headers(skew.PROTOCOL + 2, "0.4.0")
                    control.set_doc(_doc(2))
                    polls = control.polls
                    await _until(lambda: control.polls >= polls + 5, "five refused polls")
                    assert holder.current.version == 1 and [m.name for m in holder.current.models] == ["m1"]
                    errors = _errors(caplog)
                    assert len(errors) == 1, errors
                    if acting_as == "0.1.0":
                        assert (f"this router 0.2.0 (protocol {skew.PROTOCOL}) is newer than the control plane of an "
                                "unknown version (protocol 1)") in errors[0]
                        assert "upgrade the control planes first" in errors[0]
                    else:
                        assert (f"this router 0.2.0 (protocol {skew.PROTOCOL}) is too old for the control plane 0.4.0 "
                                f"(protocol {skew.PROTOCOL + 2})") in errors[0]
                    assert "serving the last table (v1)" in errors[0]
                    control.said = skew.headers(skew.PROTOCOL, "0.2.0")  # upgraded (or rolled back) to this release
                    await _until(lambda: holder.current.version == 2, "the table after the upgrade")
                    assert any("routes readable again" in r.getMessage() for r in caplog.records)
            finally:
                await watcher.stop()

        asyncio.run(run())
    finally:
        control.close()


def test_a_router_one_protocol_older_takes_the_table(caplog: pytest.LogCaptureFixture) -> None:
    """N-1 is inside the policy: a router at protocol 1 follows a control plane at 2."""
    control = RouterControl(_doc(1)).start()
    try:
        async def run() -> None:
            holder = TableHolder()
            watcher = watch.TableWatcher(control.url, holder, protocol=skew.PROTOCOL - 1, router_version="0.1.9")
            await watcher.start()
            try:
                assert await watcher.wait_loaded(WAIT_S)
            finally:
                await watcher.stop()

        with caplog.at_level(logging.INFO, logger=watch.__name__):
            asyncio.run(run())
        assert _errors(caplog) == []
        assert control.routers_said[0] == (str(skew.PROTOCOL - 1), "0.1.9")
    finally:
        control.close()
