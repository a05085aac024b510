"""The fetch meter: throttled byte reports, immediate state changes, a moving-window rate and an ETA."""

from __future__ import annotations

from llmgw.agent.fetch import meter, records


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reports_bytes_at_most_once_a_period_and_states_at_once() -> None:
    """Byte counts reach subscribers once a period at most; stalled/done are told the moment they happen."""
    clock = _Clock()
    m = meter.Meter(clock=clock, period_s=1.0)
    heard: list[records.Progress] = []
    m.subscribe(heard.append)
    m.start(total=1000, done=0)
    n = len(heard)
    for _ in range(10):
        clock.now += 0.25
        m.add(10)
    byte_reports = heard[n:]
    assert [p.done_bytes for p in byte_reports] == [40, 80]   # 2.5 s of adds, one report per second
    m.set_state("stalled", "no byte for 30 s")
    assert heard[-1].state == "stalled" and heard[-1].message == "no byte for 30 s" and heard[-1].rate_bps == 0
    clock.now += 0.01
    m.add(5)
    assert heard[-1].state == "fetching"   # the stall is over as soon as a byte comes
    m.set_state("done")
    assert heard[-1].state == "done" and heard[-1].eta_s == 0


def test_rate_is_over_a_moving_window_and_eta_follows() -> None:
    """After a fast start and a slow minute, the rate shows the slow speed, not the average since the start."""
    clock = _Clock()
    m = meter.Meter(clock=clock, period_s=0.0, window_s=5.0)
    m.start(total=10_000_000, done=0)
    for _ in range(10):
        clock.now += 0.1
        m.add(500_000)          # 5 MB/s for a second
    for _ in range(60):
        clock.now += 1.0
        m.add(1000)             # then 1 kB/s
    snap = m.snapshot()
    assert 900 <= snap.rate_bps <= 1100
    assert snap.eta_s == (snap.total_bytes - snap.done_bytes) / snap.rate_bps


def test_a_late_subscriber_hears_where_it_stands_and_a_broken_one_is_ignored() -> None:
    """Joining mid-way gives the current progress at once; a callback that raises does not stop the others."""
    clock = _Clock()
    m = meter.Meter(clock=clock, period_s=0.0)
    m.start(total=100, done=30)

    def broken(p: records.Progress) -> None:
        raise RuntimeError("subscriber bug")

    heard: list[records.Progress] = []
    m.subscribe(broken)
    m.subscribe(heard.append)
    assert heard[0].done_bytes == 30 and heard[0].total_bytes == 100
    clock.now += 1
    m.add(10)
    assert heard[-1].done_bytes == 40
