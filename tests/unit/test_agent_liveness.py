"""Liveness decisions as plain data: what one health probe of a Ready engine changes, and what it reports."""

from __future__ import annotations

import pytest

from llmgw.agent.supervisor import liveness
from llmgw.core.shards import ShardState, ShardStatus

S = ShardState
LIVE = liveness.Liveness(period_s=2.0, timeout_s=2.0, failure_threshold=3)
TIMEOUT = "timed out after 2 s"


def status(state: ShardState = S.READY, failures: int = 0, message: str = "ready after 3.0 s") -> ShardStatus:
    return ShardStatus("s1", "r1", state, message=message, pid=4242, probe_failures=failures)


def after(st: ShardStatus, v: liveness.Verdict | None) -> ShardStatus:
    """The status a verdict leaves (what the watcher records)."""
    assert v is not None
    return ShardStatus(st.shard_id, st.replica_id, v.state, message=v.message, pid=st.pid,
                       probe_failures=v.probe_failures)


def test_a_healthy_ready_engine_changes_nothing() -> None:
    """A passing probe of a READY shard with no failures is no news: nothing is moved or sent."""
    assert liveness.judge(status(), None, liveness=LIVE) is None


def test_each_failure_is_counted_and_reported_until_the_threshold_makes_it_unhealthy() -> None:
    """1/3 and 2/3 stay READY and are sent at once; the third in a row is UNHEALTHY with the reason and output."""
    first = liveness.judge(status(), TIMEOUT, liveness=LIVE)
    assert first == liveness.Verdict(S.READY, 1, "health probe failed 1/3: timed out after 2 s")
    second = liveness.judge(after(status(), first), "connection refused at http://h:1", liveness=LIVE)
    assert second == liveness.Verdict(S.READY, 2, "health probe failed 2/3: connection refused at http://h:1")
    third = liveness.judge(after(status(), second), TIMEOUT, liveness=LIVE, pid=4242, last_line="slot 0: prompt")
    assert third is not None and (third.state, third.probe_failures, third.report, third.with_output) == (
        S.UNHEALTHY, 3, True, True)
    assert third.message == ("unhealthy: health probe failed 3/3 in a row (timed out after 2 s); its process "
                             "(pid 4242) still runs but the engine does not answer; its last output: slot 0: prompt")


def test_failures_while_unhealthy_are_counted_but_not_sent() -> None:
    """Past the threshold the count goes on in the record; the status is not sent again every period."""
    st = status(S.UNHEALTHY, 3, "unhealthy: ...")
    v = liveness.judge(st, TIMEOUT, liveness=LIVE)
    assert v == liveness.Verdict(S.UNHEALTHY, 4, "unhealthy: ...", report=False)


def test_a_passing_probe_makes_it_ready_again_and_says_it_recovered() -> None:
    """From UNHEALTHY, or from READY with failures counted, one pass resets the count to 0 and is reported."""
    back = liveness.judge(status(S.UNHEALTHY, 5, "unhealthy: ..."), None, liveness=LIVE)
    assert back == liveness.Verdict(
        S.READY, 0, "recovered: the engine answers its health probe again after 5 failed in a row")
    assert liveness.judge(status(S.READY, 2), None, liveness=LIVE) == liveness.Verdict(
        S.READY, 0, "health probe passed again after 2 failed")


@pytest.mark.parametrize("state", [S.DRAINING, S.DRAINED, S.STOPPING, S.STOPPED, S.FAILED, S.STARTING])
def test_a_shard_a_drain_or_stop_has_taken_is_left_alone(state: ShardState) -> None:
    """A probe answer that lands after a drain or stop moved the shard changes nothing: that move is theirs."""
    assert liveness.judge(status(state), TIMEOUT, liveness=LIVE) is None
    assert liveness.judge(status(state, 2), None, liveness=LIVE) is None


def test_a_threshold_of_one_makes_the_first_failure_unhealthy() -> None:
    """With failure_threshold 1 there is no READY-with-failures step; without output, the message says so."""
    v = liveness.judge(status(), "/health answered 503 Service Unavailable", liveness=liveness.Liveness(
        failure_threshold=1))
    assert v is not None and (v.state, v.probe_failures) == (S.UNHEALTHY, 1)
    assert "(/health answered 503 Service Unavailable)" in v.message and v.message.endswith("it wrote no output")


@pytest.mark.parametrize("bad", [{"period_s": 0}, {"timeout_s": -1.0}, {"failure_threshold": 0}])
def test_liveness_refuses_values_that_would_never_probe_or_never_decide(bad: dict[str, float]) -> None:
    """A zero period would spin, a zero timeout fail every probe, a zero threshold never count: refused."""
    with pytest.raises(ValueError, match="above 0"):
        liveness.Liveness(**bad)  # type: ignore[arg-type]
