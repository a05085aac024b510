"""Adapter affinity: the pure decisions (vLLM's LRU rule for an engine's LoRA cache, ``touch``; which replicas
an adapter's request may go to, ``candidates``), the router's model of each cache built on them, and the
slots the control plane's table says."""

from __future__ import annotations

from llmgw.api import routing
from llmgw.control.loop.table import _model_route
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.core import adapters, specs
from llmgw.core.adapteraffinity import BUSY_SPREAD, candidates, touch
from llmgw.router.adaptercache import AdapterCaches
from llmgw.router.table import RouteTable


def test_touch_loads_into_a_free_slot_without_evicting() -> None:
    assert touch((), "a", 2) == (("a",), ())
    assert touch(("a",), "b", 2) == (("a", "b"), ())


def test_touch_at_the_limit_evicts_the_least_recently_used() -> None:
    assert touch(("a", "b"), "c", 2) == (("b", "c"), ("a",))


def test_touch_of_a_held_adapter_makes_it_the_most_recent_and_evicts_nothing() -> None:
    held, evicted = touch(("a", "b"), "a", 2)
    assert (held, evicted) == (("b", "a"), ())
    # so the next load evicts b, not a
    assert touch(held, "c", 2) == (("a", "c"), ("b",))
    assert touch(("a", "b"), "b", 2) == (("a", "b"), ())


def test_touch_after_the_limit_shrank_evicts_down_to_it() -> None:
    assert touch(("a", "b", "c"), "d", 2) == (("c", "d"), ("a", "b"))


def test_touch_without_a_capacity_evicts_nothing() -> None:
    assert touch(("a", "b"), "c", 0) == (("a", "b", "c"), ())


def test_a_holder_is_chosen_over_a_less_loaded_replica() -> None:
    held = {"r1": ("a", "b"), "r2": ("c", "d")}
    assert candidates("a", ["r1", "r2"], held, {"r1": 2, "r2": 0}) == (("r1",), False)
    assert candidates("c", ["r1", "r2"], held, {"r1": 0, "r2": 2}) == (("r2",), False)


def test_every_holder_that_is_not_busy_is_a_candidate() -> None:
    held = {"r1": ("a",), "r2": ("a",), "r3": ()}
    assert candidates("a", ["r1", "r2", "r3"], held, {"r1": 1, "r2": 0}) == (("r1", "r2"), False)


def test_a_busy_holder_sends_the_request_to_the_least_loaded_replica_which_loads_it() -> None:
    held = {"r1": ("a",), "r2": ("b",)}
    busy = {"r1": BUSY_SPREAD, "r2": 0}
    assert candidates("a", ["r1", "r2"], held, busy) == (("r2",), True)
    # one request fewer and it stays with its holder
    assert candidates("a", ["r1", "r2"], held, {"r1": BUSY_SPREAD - 1, "r2": 0}) == (("r1",), False)


def test_an_adapter_no_replica_holds_goes_to_the_least_loaded_with_a_free_slot_first() -> None:
    held = {"r1": ("a", "b"), "r2": ("c",), "r3": ()}
    assert candidates("d", ["r1", "r2", "r3"], held, {"r3": 1}) == (("r2",), True)
    assert candidates("d", ["r1", "r2", "r3"], held, {}) == (("r3",), True)
    assert candidates("d", ["r1", "r2"], {"r1": ("a",), "r2": ("b",)}, {}) == (("r1", "r2"), True)


def test_excluded_replicas_are_never_candidates() -> None:
    held = {"r1": ("a",), "r2": ()}
    assert candidates("a", ["r1", "r2"], held, {}, exclude={"r1"}) == (("r2",), True)
    assert candidates("a", ["r1", "r2"], held, {}, exclude={"r1", "r2"}) == ((), False)
    # the least loaded is taken among the replicas left, not among the excluded
    assert candidates("b", ["r1", "r2"], held, {"r1": 0, "r2": 3}, exclude={"r1"}) == (("r2",), True)


def test_the_table_says_how_many_adapters_one_engine_holds_as_its_flags_do() -> None:
    r = ReplicaRecord(id="a", model="m", fingerprint="f", phase=Phase.READY, api_key="k", node_id="n1",
                      shard_id="a-1", endpoint="http://127.0.0.1:1")
    listed = tuple(adapters.Adapter(f"l{i}", "/srv/l") for i in range(20))
    for count, slots in ((0, 0), (3, 4), (20, adapters.MAX_SLOTS)):
        spec = specs.ModelSpec(engine="vllm", served_name="m", adapters=listed[:count])
        route = _model_route(spec, "m", spec, [r], 0.0, {"a": ("l0",)})
        assert route.adapter_slots == slots
        args = adapters.launch_args("vllm", spec.adapters)[0]
        assert (args[args.index("--max-cpu-loras") + 1] if args else "0") == str(slots)


def test_the_routers_cache_model_follows_its_picks_and_forgets_replicas_gone_from_the_table() -> None:
    def table(*replicas: str) -> RouteTable:
        eps = tuple(routing.EndpointDoc(r, f"http://127.0.0.1:{9000 + i}", adapters=("a", "b", "c"))
                    for i, r in enumerate(replicas))
        return RouteTable.from_doc(routing.EndpointsDoc(models=(routing.ModelEntry(
            name="base", endpoints=eps, adapters=("a", "b", "c"), adapter_slots=2),)).to_doc())

    t = table("r1", "r2")
    a, b, c = (t.lookup(n) for n in "abc")
    assert a is not None and b is not None and c is not None
    caches = AdapterCaches()
    assert caches.exclude(a, ["r1", "r2"], {}, ()) == set()  # nobody holds a: both may take it
    caches.used(a, "r1")
    assert caches.exclude(a, ["r1", "r2"], {}, ()) == {"r2"}
    caches.used(b, "r1")
    caches.used(c, "r1")  # two slots: a evicted from r1's model
    assert caches.held["r1"] == ("b", "c")
    assert caches.exclude(a, ["r1", "r2"], {}, ()) == {"r1"}  # the free replica loads it, not the full one
    assert caches.exclude(b, ["r1", "r2"], {}, {"r1"}) == {"r1"}  # its holder excluded: the other loads it
    caches.used(a, "r2")
    caches.follow(table("r2", "r3"))
    assert caches.held == {"r2": ("a",)}
