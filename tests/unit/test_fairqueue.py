"""The admission queue's order as pure functions: strict tiers, weighted fair shares within one, no starvation."""

from __future__ import annotations

import collections

from llmgw.core import fairqueue, queueclasses
from llmgw.core.priorities import BATCH, INTERACTIVE


def _drain(q: fairqueue.FairQueue[str]) -> list[str]:
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


def test_a_flow_with_100_times_the_waiters_gets_its_share_not_the_queue() -> None:
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    for i in range(1000):
        q.push(f"heavy{i}", flow="heavy")
    for i in range(10):
        q.push(f"light{i}", flow="light")
    order = _drain(q)
    # The light flow's 10 waiters are among the first 20 admitted, one in two, though they came after 1000.
    assert [o for o in order[:20] if o.startswith("light")] == [f"light{i}" for i in range(10)]
    assert order[:20:2] == [f"heavy{i}" for i in range(10)] or order[1:20:2] == [f"heavy{i}" for i in range(10)]
    # First come first served within a flow.
    assert [o for o in order if o.startswith("heavy")] == [f"heavy{i}" for i in range(1000)]


def test_fifo_mode_keeps_arrival_order() -> None:
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue(fair=False)
    for i in range(5):
        q.push(f"heavy{i}", flow="heavy")
    q.push("light", flow="light")
    assert _drain(q) == [f"heavy{i}" for i in range(5)] + ["light"]


def test_weights_set_the_shares_while_both_are_backlogged() -> None:
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    for _ in range(300):
        q.push("a", flow="a", weight=3)
        q.push("b", flow="b", weight=1)
    first = collections.Counter(_drain(q)[:200])
    assert first == {"a": 150, "b": 50}


def test_every_prefix_keeps_the_fairness_bound() -> None:
    """SCFQ's bound: at any point of a backlogged run, two flows' admissions per unit of weight differ by at most
    1/w_i + 1/w_j, and each flow is within two waiters of its weighted share."""
    weights = {"a": 1.0, "b": 2.0, "c": 5.0}
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    for _ in range(400):
        for flow, w in weights.items():
            q.push(flow, flow=flow, weight=w)
    served: collections.Counter[str] = collections.Counter()
    total = sum(weights.values())
    for n in range(1, 401):
        served[q.pop() or ""] += 1
        for flow, w in weights.items():
            assert abs(served[flow] - n * w / total) <= 2.0, (n, dict(served))
            for other, v in weights.items():
                assert abs(served[flow] / w - served[other] / v) <= 1 / w + 1 / v + 1e-9, (n, dict(served))


def test_a_newcomer_is_not_starved_by_a_long_backlog() -> None:
    """A flow arriving while another has a backlog goes next but one: its tag starts at V, not behind the queue."""
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    for i in range(50):
        q.push(f"old{i}", flow="old")
    assert [q.pop() for _ in range(10)] == [f"old{i}" for i in range(10)]
    q.push("new", flow="new")
    assert [q.pop(), q.pop()] == ["old10", "new"]


def test_an_idle_flow_banks_no_credit() -> None:
    """A flow idle while others were served does not then take a burst of turns in a row."""
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    for i in range(20):
        q.push(f"a{i}", flow="a")
    for _ in range(15):
        q.pop()
    for i in range(5):
        q.push(f"b{i}", flow="b")
    for i in range(20, 25):
        q.push(f"a{i}", flow="a")
    order = _drain(q)
    assert order[:4] in (["a15", "b0", "a16", "b1"], ["b0", "a15", "b1", "a16"])


def test_tiers_are_strict_and_priority_orders_within_a_class() -> None:
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    q.push("batch", rank=1, flow="x")
    q.push("low", rank=0, priority=0, flow="x")
    q.push("high", rank=0, priority=9, flow="y")
    q.push("low2", rank=0, priority=0, flow="z")
    assert _drain(q) == ["high", "low", "low2", "batch"]


def test_state_is_dropped_when_a_tier_empties() -> None:
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    for i in range(100):
        q.push(str(i), flow=f"f{i}")
    _drain(q)
    assert q.pop() is None and len(q) == 0 and not q._tiers
    assert q.push("again", flow="f1") == 1.0  # a fresh start: no history of the earlier burst


def test_a_weight_out_of_range_is_clamped_not_a_crash() -> None:
    q: fairqueue.FairQueue[str] = fairqueue.FairQueue()
    assert q.push("z", flow="z", weight=0) == 1 / fairqueue.MIN_WEIGHT


def test_classes_refusals() -> None:
    assert queueclasses.classes_refusal(["premium", INTERACTIVE, BATCH]) is None
    assert "end with 'batch'" in (queueclasses.classes_refusal([BATCH, INTERACTIVE]) or "")
    assert "'interactive'" in (queueclasses.classes_refusal(["premium", BATCH]) or "")
    assert "twice" in (queueclasses.classes_refusal([INTERACTIVE, INTERACTIVE, BATCH]) or "")
    assert "not a class name" in (queueclasses.classes_refusal(["Prem ium", INTERACTIVE, BATCH]) or "")
    assert queueclasses.weight_refusal(0) is None and queueclasses.weight_refusal(2.5) is None
    assert "from 0.01" in (queueclasses.weight_refusal(-1) or "")
    assert queueclasses.weight_refusal(True) is not None


def test_a_requests_class_flow_and_weight() -> None:
    classes = queueclasses.Classes(("premium", INTERACTIVE, "bulk", BATCH))
    plain = classes.queue_as(key_id="k1", project="team-a")
    assert (plain.klass, plain.rank, plain.flow, plain.weight) == (INTERACTIVE, 1, "project:team-a", 1.0)
    by_project = classes.queue_as(key_id="k1", project="team-a", project_class="premium", project_weight=4)
    assert (by_project.klass, by_project.rank, by_project.flow, by_project.weight) == ("premium", 0,
                                                                                      "project:team-a", 4)
    own = classes.queue_as(key_id="k1", project="team-a", key_class="bulk", key_weight=2,
                           project_class="premium", project_weight=4)
    assert (own.klass, own.flow, own.weight) == ("bulk", "key:k1", 2)
    assert classes.queue_as(key_id="k2", project="default").flow == "key:k2"
    assert classes.queue_as(key_id="k3", project="x", key_class="gone").klass == INTERACTIVE


def test_the_header_lowers_never_raises() -> None:
    classes = queueclasses.Classes(("premium", INTERACTIVE, BATCH))
    mine = classes.queue_as(key_id="k", project="p")
    lowered = classes.lowered(mine, "Batch")
    assert isinstance(lowered, queueclasses.QueueAs) and (lowered.klass, lowered.rank) == (BATCH, 2)
    assert lowered.flow == mine.flow
    assert classes.lowered(mine, "premium") is mine  # clamped to its own
    refused = classes.lowered(mine, "urgent")
    assert isinstance(refused, str) and "X-Llmgw-Priority" in refused and "premium, interactive, batch" in refused
