"""The rolling-upgrade test's traffic (``llmgw.testing.openaitraffic``) against real sim engines: it must count a
failure as one (else the upgrade test's "0 failed" would prove nothing), and ``switch`` must leave nothing on the
old URL once its requests ended."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import routed
from llmgw.testing.openaitraffic import HeldStreams, Traffic
from llmgw.testing.procs import wait_for


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[routed.Procs]:
    with routed.started(tmp_path) as p:
        yield p


def test_requests_to_a_server_gone_are_counted_failed_in_their_phase(sims: routed.Procs) -> None:
    url = sims.sim("m", "--decode-tps", "400")
    with Traffic(url, ["m"], pace_s=0.05) as traffic:
        traffic.wait_served(6)
        gone = traffic.phase("gone")
        before = traffic.tallies["start"]
        served, failed = before.ok, list(before.failures)  # now: a request in flight at the kill counts there
        sims.procs[0].signal(signal.SIGKILL)
        wait_for(lambda: len(gone.failures) >= 4, timeout=30, what="failures counted")
    assert served >= 6 and before.streamed >= 1 and before.by_model["m"] >= served and failed == []
    assert all(f"via {url}" in f for f in gone.failures), gone.failures
    assert {f.split(" ")[1] for f in gone.failures} == {"stream", "whole"}, gone.failures  # both kinds counted
    assert [f for f in traffic.failures if f.startswith("gone: ")] == [f"gone: {f}" for f in gone.failures]


def test_after_a_switch_nothing_is_sent_to_the_old_url(sims: routed.Procs) -> None:
    old, new = sims.sim("m", "--decode-tps", "400"), sims.sim("m", "--decode-tps", "400")
    with Traffic(old, ["m"], pace_s=0.05) as traffic:
        traffic.wait_served(6)
        traffic.switch(new)
        wait_for(lambda: traffic.open_on(old) == 0, timeout=30, what="the old URL's requests ended")
        sims.procs[0].signal(signal.SIGKILL)  # the old server gone: a request still sent there would fail
        traffic.wait_served(10)
    assert traffic.url == new
    assert traffic.failures == [] and traffic.served >= 16


def test_held_streams_report_a_cut_stream(sims: routed.Procs) -> None:
    url = sims.sim("m", "--decode-tps", "100")
    held = HeldStreams(url, "m", n=2, max_tokens=2000).start()
    held.wait_flowing()
    assert held.open == 2
    sims.procs[0].signal(signal.SIGKILL)
    outcomes = held.join()
    assert len(outcomes) == 2 and all(o != "ok" and "chunks" in o for o in outcomes), outcomes
