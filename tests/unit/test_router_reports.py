"""Router events as the in-process server wires them (router sink -> control-plane recorder), and the listen guard."""

from __future__ import annotations

import logging

import pytest

from llmgw.api.routing import RouterReport
from llmgw.control.routerreports import BadReport, RouterEvents
from llmgw.router import auth
from llmgw.router import reports as events


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ejection_then_recovery_through_the_callback() -> None:
    """An ejection shows on the replica with its router and reason; the recovery clears it."""
    clock = Clock()
    recorder = RouterEvents(clock=clock)
    sink = events.CallbackSink("server", recorder.record, clock=clock)
    sink.ejected("m", "m-1", for_s=2.0, failures=3, reason="HTTP 503")
    assert recorder.message("m-1") == "ejected by router server for 2s: 3 consecutive failures (last: HTTP 503)"
    sink.recovered("m", "m-1")
    assert recorder.ejections("m-1") == []


def test_recovery_of_a_replica_never_ejected_is_not_sent() -> None:
    """A success after a short failure streak reports nothing: no ejection was reported to take back."""
    sent: list[object] = []
    sink = events.CallbackSink("r1", sent.append)
    sink.recovered("m", "m-1")
    assert sent == []


def test_ejections_expire_and_each_router_is_shown() -> None:
    """Two routers' ejections both show; each goes once its backoff has passed."""
    clock = Clock()
    recorder = RouterEvents(clock=clock)
    for router, for_s in (("r1", 2.0), ("r2", 8.0)):
        recorder.record({"router": router, "events": [{"type": "ejected", "model": "m", "replica": "m-1",
                                                        "for_s": for_s, "failures": 1, "reason": "x"}]})
    assert [e.router for e in recorder.ejections("m-1")] == ["r1", "r2"]
    assert "a failure on probation" in recorder.message("m-1")
    clock.now += 3
    assert [e.router for e in recorder.ejections("m-1")] == ["r2"]
    clock.now += 10
    assert recorder.message("m-1") == ""


def test_a_callback_that_raises_does_not_fail_the_request(caplog: pytest.LogCaptureFixture) -> None:
    """A recorder that raises: ejected() returns, the bug is logged, and the next event still reaches it."""
    seen: list[str] = []

    def flaky(report: RouterReport) -> None:
        seen.append(report.to_doc()["events"][0]["type"])
        if len(seen) == 1:
            raise RuntimeError("boom in the recorder")

    sink = events.CallbackSink("r1", flaky)
    with caplog.at_level(logging.ERROR, logger=events.__name__):
        sink.ejected("m", "m-1", for_s=2, failures=3, reason="x")  # what the request path calls: must not raise
    assert seen == ["ejected"]  # it was delivered, not skipped
    assert "recording a router event failed" in caplog.text and "boom in the recorder" in caplog.text
    sink.recovered("m", "m-1")  # the sink still knows the ejection and still delivers
    assert seen == ["ejected", "recovered"]


@pytest.mark.parametrize("doc, field", [
    ({"events": []}, "router"),
    ({"router": "r1", "events": {}}, "events"),
    ({"router": "r1", "events": [{"type": "ejected", "model": "m"}]}, "events[0].replica"),
    ({"router": "r1", "events": [{"type": "ejected", "model": "m", "replica": "x", "for_s": -1}]}, "events[0].for_s"),
])
def test_bad_reports_name_the_field(doc: dict[str, object], field: str) -> None:
    """Refused reports say which field is wrong, and nothing of them is applied."""
    recorder = RouterEvents()
    with pytest.raises(BadReport, match=field.replace("[", r"\[").replace("]", r"\]")):
        recorder.record(doc)


def _table_auth(*, keys: bool) -> auth.Authenticator:
    doc = {"required": True, "keys": [{"id": "k1", "sha256": "ab" * 32}]} if keys else {"required": False}
    return auth.Authenticator.from_doc(doc)


def test_listen_guard_warns_beyond_loopback_each_time_keys_run_out() -> None:
    """Beyond loopback: a warning when the first table has no key, none while keys exist, again when they go."""
    said: list[str] = []
    guard = auth.ListenGuard("0.0.0.0", warn=said.append)
    guard.check(_table_auth(keys=False))
    guard.check(_table_auth(keys=False))  # the same state again: not repeated
    assert len(said) == 1 and "0.0.0.0" in said[0] and "llmgw key create" in said[0]
    guard.check(_table_auth(keys=True))
    assert len(said) == 1
    guard.check(_table_auth(keys=False))  # the last key deleted
    assert len(said) == 2


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.5"])
def test_listen_guard_is_silent_on_loopback(host: str) -> None:
    """Auth off is what a loopback listen may have: no warning."""
    said: list[str] = []
    auth.ListenGuard(host, warn=said.append).check(_table_auth(keys=False))
    assert said == []
