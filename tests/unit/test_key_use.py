"""Keys' "last used": the per-key coalescing (core.latest), the router's reports, the control plane's recording,
the store's writes, and how the CLI and the UI word the time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from llmgw.control.routerreports import BadReport, RouterEvents
from llmgw.control.store import store as store_mod
from llmgw.core import latest, units
from llmgw.router import keyuse
from llmgw.router import reports as events


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_latest_hands_on_the_first_use_at_once_and_the_newest_of_a_burst_once_its_interval_ends() -> None:
    """A key not taken lately is due now; uses inside its interval ask for one take at the interval's end,
    which carries the newest of them."""
    lt = latest.Latest(every_s=5.0)
    assert lt.offer("k", 100.0, now=100.0) == 0.0
    assert lt.take("k", now=100.0) == 100.0
    assert lt.offer("k", 101.0, now=101.0) == 4.0  # due when 5 s have passed since the take
    assert lt.offer("k", 103.0, now=103.0) is None  # already scheduled: only the time moves on
    assert lt.offer("k", 102.0, now=103.5) is None  # an older report (another router) changes nothing
    assert lt.offer("other", 103.0, now=103.0) == 0.0  # keys are independent
    assert lt.take("k", now=105.0) == 103.0
    assert lt.take("k", now=105.0) is None  # nothing new since
    assert lt.offer("k", 200.0, now=200.0) == 0.0  # long after: at once again
    assert lt.take_all(now=200.0) == {"k": 200.0, "other": 103.0}
    assert lt.take_all(now=200.0) == {}


def test_router_reports_a_key_once_per_interval_with_its_newest_use() -> None:
    """Through the sink, a busy key is one ``key_used`` event at once and one at the interval's end carrying the
    last use; the anonymous key (no keys exist) is never reported; stop flushes what is pending."""
    sent: list[dict[str, Any]] = []
    clock = Clock()

    async def scenario() -> None:
        sink = events.CallbackSink("r1", lambda report: sent.extend(report.to_doc()["events"]), clock=clock,
                                   key_use_every_s=0.05)
        sink.key_used("key-a")
        clock.now = 1000.01
        sink.key_used("key-a")
        clock.now = 1000.02
        sink.key_used("key-a")
        assert sent == [{"type": "key_used", "key": "key-a", "at": 1000.0}]
        await asyncio.sleep(0.2)  # the interval's end (loop time) passes
        assert sent[1:] == [{"type": "key_used", "key": "key-a", "at": 1000.02}]
        sink.key_used("key-b")
        clock.now = 1000.03
        sink.key_used("key-b")
        await sink.stop()  # before its timer: the pending use goes out now
        assert sent[2:] == [{"type": "key_used", "key": "key-b", "at": 1000.02},
                            {"type": "key_used", "key": "key-b", "at": 1000.03}]

    asyncio.run(scenario())


def test_key_use_report_without_a_running_loop_between_uses_is_one_call_per_key() -> None:
    """KeyUse alone: the first use of each key reaches ``report`` at once, with the clock's time."""
    got: list[tuple[str, float]] = []
    clock = Clock()

    async def scenario() -> None:
        ku = keyuse.KeyUse(lambda k, at: got.append((k, at)), every_s=60.0, clock=clock)
        ku.used("a")
        ku.used("b")
        ku.used("a")
        assert got == [("a", 1000.0), ("b", 1000.0)]
        ku.flush()
        assert got == [("a", 1000.0), ("b", 1000.0), ("a", 1000.0)]

    asyncio.run(scenario())


def test_control_plane_hands_key_used_to_its_writer_and_checks_the_event() -> None:
    """A ``key_used`` event reaches ``on_key_used`` with its key and time, leaves the ejections alone, and a
    malformed one is refused naming its field before anything in the report applies."""
    noted: list[tuple[str, float]] = []
    rec = RouterEvents(clock=Clock(), on_key_used=lambda k, at: noted.append((k, at)))
    assert rec.record({"router": "r1", "events": [{"type": "key_used", "key": "key-a", "at": 990.0},
                                                   {"type": "key_used", "key": "key-b"}]}) == 2
    assert noted == [("key-a", 990.0), ("key-b", 1000.0)] and rec.current() == {}
    with pytest.raises(BadReport, match=r"events\[1\]\.key: expected a non-empty string"):
        rec.record({"router": "r1", "events": [{"type": "key_used", "key": "key-c"}, {"type": "key_used"}]})
    with pytest.raises(BadReport, match=r"events\[0\]\.at: expected a number >= 0"):
        rec.record({"router": "r1", "events": [{"type": "key_used", "key": "k", "at": "soon"}]})
    assert noted == [("key-a", 990.0), ("key-b", 1000.0)]
    # Without a writer (a bare create_api) the event is accepted and dropped.
    assert RouterEvents().record({"router": "r1", "events": [{"type": "key_used", "key": "k"}]}) == 1


def test_store_keeps_the_newest_use_and_disables_and_enables(tmp_path: Path) -> None:
    """touch_keys never moves a key's last use back, ignores unknown keys; set_key_disabled answers the key
    (None for an unknown one)."""
    store = store_mod.Store.open(tmp_path)
    try:
        store.add_key(store_mod.StoredKey("k1", "team", "ab" * 32, created_at=1.0))
        assert store.list_keys()[0].last_used_at == 0.0
        store.touch_keys({"k1": 50.0, "gone": 60.0})
        store.touch_keys({"k1": 40.0})
        assert store.list_keys()[0].last_used_at == 50.0
        assert store.set_key_disabled("k1", True).disabled  # type: ignore[union-attr]
        assert store.list_keys()[0].disabled
        assert not store.set_key_disabled("k1", False).disabled  # type: ignore[union-attr]
        assert store.set_key_disabled("nope", True) is None
    finally:
        store.close()


def test_last_used_is_worded_never_or_how_long_ago() -> None:
    """0 is "never"; otherwise seconds, minutes, hours or days ago."""
    assert units.format_ago(0, now=1000.0) == "never"
    assert units.format_ago(988.0, now=1000.0) == "12s ago"
    assert units.format_ago(1000.0 - 150, now=1000.0) == "2m ago"
    assert units.format_ago(1000.0 - 3 * 3600, now=1000.0) == "3h ago"
    assert units.format_ago(1005.0, now=1000.0) == "0s ago"  # a clock a little ahead is not "in the future"
