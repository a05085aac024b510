"""Outlier ejection as a state machine on an injected clock."""

from __future__ import annotations

from llmgw.router import health


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_three_failures_in_a_row_eject_for_two_seconds() -> None:
    """Two failures do nothing; the third ejects for 2 s, with the reason; then it is back on probation."""
    clock = Clock()
    out = health.Outliers(clock=clock)
    assert out.failed("r1", "refused") is None
    assert out.failed("r1", "refused") is None
    assert not out.is_ejected("r1")
    ejection = out.failed("r1", "HTTP 503")
    assert ejection == health.Ejection("r1", 2.0, "HTTP 503", failures=3)
    assert out.is_ejected("r1") and out.ejected(["r1", "r2"]) == {"r1"}
    clock.now += 1.9
    assert out.is_ejected("r1")
    clock.now += 0.2
    assert not out.is_ejected("r1")


def test_failing_on_probation_doubles_the_backoff_up_to_the_cap() -> None:
    """Each failure after an ejection ends ejects again at once, for twice as long, capped at 60 s."""
    clock = Clock()
    out = health.Outliers(clock=clock)
    for _ in range(3):
        out.failed("r1", "refused")
    lengths = []
    for _ in range(7):
        clock.now += 1000  # past any ejection: on probation
        ejection = out.failed("r1", "refused")
        assert ejection is not None
        lengths.append(ejection.for_s)
    assert lengths == [4, 8, 16, 32, 60, 60, 60]


def test_a_success_resets_and_failures_while_ejected_do_not_extend() -> None:
    """A success ends the streak and the probation; a failure while already ejected changes nothing."""
    clock = Clock()
    out = health.Outliers(clock=clock)
    out.failed("r1", "x")
    out.failed("r1", "x")
    assert out.succeeded("r1") is True
    assert out.failed("r1", "x") is None and out.failed("r1", "x") is None  # the streak started over
    assert out.failed("r1", "x") is not None
    assert out.failed("r1", "x") is None  # tried while ejected (all were): already out
    clock.now += 2.5
    assert out.succeeded("r1") is True
    clock.now += 1000
    for _ in range(2):
        assert out.failed("r1", "x") is None  # probation ended with the success: three needed again
    assert out.failed("r1", "x") == health.Ejection("r1", 2.0, "x", failures=3)
    assert out.succeeded("r-healthy") is False


def test_replicas_are_independent_and_forgotten_when_gone() -> None:
    """One replica's failures do not touch another's; forget drops replicas that left the table."""
    clock = Clock()
    out = health.Outliers(clock=clock)
    for _ in range(3):
        out.failed("r1", "x")
    out.failed("r2", "x")
    assert out.ejected(["r1", "r2"]) == {"r1"}
    out.forget({"r2"})
    assert out.ejected(["r1", "r2"]) == set()
    assert out.failed("r2", "x") is None and out.failed("r2", "x") is not None  # r2 kept its streak


def test_four_xx_is_not_a_failure_status() -> None:
    """Only 500, 502, 503 and 504 count; a client's bad request never ejects an engine."""
    assert health.FAILURE_STATUSES == {500, 502, 503, 504}
    assert not {400, 401, 404, 413, 422, 429} & health.FAILURE_STATUSES
