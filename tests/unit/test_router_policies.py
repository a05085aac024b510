"""Routing policies and the load signals they read, on plain data: no sockets, no clock."""

from __future__ import annotations

import collections
import logging

import pytest

from llmgw.core import specs
from llmgw.router import loadwatch, pick, policies
from llmgw.router.table import Endpoint, RouteTable

EPS = tuple(Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3))


def ids(endpoints: object) -> list[str]:
    return [e.replica_id for e in endpoints]  # type: ignore[attr-defined]


# --- least outstanding ------------------------------------------------------------------------


def test_least_outstanding_takes_the_least_loaded() -> None:
    """The endpoint with the smallest load wins, whatever its place in the table."""
    policy = pick.LeastOutstanding()
    chosen = policy.pick("m", EPS, load={"r0": 4, "r1": 1, "r2": 3})
    assert chosen is not None and chosen.replica_id == "r1"


def test_least_outstanding_ties_go_round_robin() -> None:
    """An idle cluster is shared evenly, not sent to the first endpoint every time."""
    policy = pick.LeastOutstanding()
    picks = [policy.pick("m", EPS) for _ in range(300)]
    assert collections.Counter(ids(picks)) == {"r0": 100, "r1": 100, "r2": 100}
    # Ties among the least loaded only: r1 is busier and never chosen.
    tied = [policy.pick("m", EPS, load={"r1": 2}) for _ in range(4)]
    assert set(ids(tied)) == {"r0", "r2"}


def test_least_outstanding_respects_exclude() -> None:
    """An excluded endpoint is skipped even when it is the least loaded; None once all are."""
    policy = pick.LeastOutstanding()
    chosen = policy.pick("m", EPS, load={"r0": 0, "r1": 5, "r2": 2}, exclude={"r0"})
    assert chosen is not None and chosen.replica_id == "r2"
    assert policy.pick("m", EPS, exclude={"r0", "r1", "r2"}) is None
    assert policy.pick("m", ()) is None


# --- session affinity -------------------------------------------------------------------------


def _assign(policy: pick.SessionAffinity, endpoints: tuple[Endpoint, ...], n: int = 3000) -> dict[str, str]:
    out = {}
    for i in range(n):
        chosen = policy.pick("m", endpoints, key=pick.RequestKey(session=f"user-{i}"))
        assert chosen is not None
        out[f"user-{i}"] = chosen.replica_id
    return out


def test_session_affinity_is_stable_and_spread() -> None:
    """A session always lands on the same endpoint, and sessions spread roughly evenly."""
    policy = pick.SessionAffinity()
    first, again = _assign(policy, EPS), _assign(policy, EPS)
    assert first == again
    counts = collections.Counter(first.values())
    assert all(800 < c < 1200 for c in counts.values()), counts


def test_session_affinity_moves_only_the_changed_share() -> None:
    """Adding a fourth endpoint moves about 1/4 of sessions, all to it; removing one moves only its own."""
    policy = pick.SessionAffinity()
    before = _assign(policy, EPS)
    grown = EPS + (Endpoint("r3", "http://127.0.0.1:9003"),)
    after = _assign(policy, grown)
    moved = [s for s in before if before[s] != after[s]]
    assert all(after[s] == "r3" for s in moved)
    assert 0.18 < len(moved) / len(before) < 0.32
    shrunk = _assign(policy, EPS[1:])
    moved = [s for s in before if before[s] != shrunk[s]]
    assert all(before[s] == "r0" for s in moved) and len(moved) == sum(v == "r0" for v in before.values())


def test_session_affinity_retry_and_no_key() -> None:
    """A retry goes to the session's next choice; without a key it is least outstanding."""
    policy = pick.SessionAffinity()
    key = pick.RequestKey(session="alice")
    first = policy.pick("m", EPS, key=key)
    assert first is not None
    second = policy.pick("m", EPS, key=key, exclude={first.replica_id})
    assert second is not None and second.replica_id != first.replica_id
    chosen = policy.pick("m", EPS, load={"r0": 3, "r1": 3, "r2": 0})
    assert chosen is not None and chosen.replica_id == "r2"


def test_round_robin_accepts_the_common_interface() -> None:
    """Round-robin takes load and key like the others and ignores them."""
    policy = pick.RoundRobin()
    picks = [policy.pick("m", EPS, load={"r0": 9}, key=pick.RequestKey(session="s")) for _ in range(3)]
    assert ids(picks) == ["r0", "r1", "r2"]


# --- the routing field ------------------------------------------------------------------------


def _doc(**extra: object) -> dict[str, object]:
    return {"version": 1, "models": [{"name": "m", "endpoints": [], **extra}]}


@pytest.mark.parametrize("routing", pick.ROUTINGS)
def test_table_reads_routing(routing: str) -> None:
    """Each known routing value is kept on the model's route."""
    assert RouteTable.from_doc(_doc(routing=routing)).models[0].routing == routing


def test_table_routing_defaults_and_unknown_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """No routing is prefix_cache; an unknown one falls back to it with one warning, not one per table."""
    assert RouteTable.from_doc(_doc()).models[0].routing == pick.DEFAULT_ROUTING == "prefix_cache"
    with caplog.at_level(logging.WARNING, logger="llmgw.router.table"):
        for _ in range(3):
            assert RouteTable.from_doc(_doc(routing="fastest-please")).models[0].routing == "prefix_cache"
    assert len([r for r in caplog.records if "fastest-please" in r.getMessage()]) == 1


# --- load signals -----------------------------------------------------------------------------

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 0.4375
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 12345.0
vllm:num_requests_waiting_extra{model_name="x"} 99
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",tp_rank="0"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",tp_rank="0"} 5.0
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct",tp_rank="0"} 0.28
"""

LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1024
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 4
"""

SIM = """\
# HELP llmgw_sim_requests_running Requests generating now.
# TYPE llmgw_sim_requests_running gauge
llmgw_sim_requests_running 8
# HELP llmgw_sim_requests_waiting Requests waiting for a slot.
# TYPE llmgw_sim_requests_waiting gauge
llmgw_sim_requests_waiting 1
llmgw_sim_requests_total 40
"""


@pytest.mark.parametrize(("text", "waiting", "running", "kv"), [
    (VLLM, 3.0, 7.0, 0.4375), (SGLANG, 5.0, 12.0, None), (LLAMACPP, 4.0, 2.0, None), (SIM, 1.0, 8.0, None)])
def test_engine_metrics_are_read(text: str, waiting: float, running: float, kv: float | None) -> None:
    """Each engine's queue and running gauges are found in its real exposition format."""
    load = loadwatch.engine_load(loadwatch.parse_gauges(text))
    assert (load.waiting, load.running, load.kv_cache_usage) == (waiting, running, kv)


def test_parser_sums_label_sets_and_survives_odd_lines() -> None:
    """Two label sets of a gauge are summed; spaces in labels, timestamps and junk lines do not break it."""
    text = ('vllm:num_requests_waiting{model_name="a b} c",engine="0"} 2 1700000000000\n'
            'vllm:num_requests_waiting{model_name="d",engine="1"} 1.5\n'
            "vllm:num_requests_running NaN-ish\n"
            "\n"
            "garbage\n")
    assert loadwatch.parse_gauges(text) == {"vllm:num_requests_waiting": 3.5}


def test_load_is_in_flight_plus_engine_waiting() -> None:
    """Combined load adds the router's in-flight count and the engine's queue, not its running count."""
    loads = loadwatch.Loads()
    loads.started("r0")
    loads.started("r0")
    loads.engine["r0"] = loadwatch.EngineLoad(waiting=3, running=10)
    assert loads.load("r0") == 5 and loads.load("r-unknown") == 0
    loads.finished("r0")
    loads.finished("r0")
    loads.finished("r0")  # one too many must not go negative
    assert loads.in_flight == {} and loads.of(["r0"]) == {"r0": 3}


# --- the registry -----------------------------------------------------------------------------


def test_the_registry_is_the_specs_list_of_policies() -> None:
    """Every name a spec may give has its policy, and every policy a name a spec may give, in the same order."""
    assert tuple(policies.REGISTRY) == specs.ROUTING_POLICIES == pick.ROUTINGS
    assert policies.DEFAULT in policies.REGISTRY
    assert all(cls.name == name for name, cls in policies.REGISTRY.items())


def test_only_the_policies_that_read_the_key_get_the_prompt_hashed() -> None:
    assert policies.KEYED == {"prefix_cache", "session_affinity", "kv_aware"}


@pytest.mark.parametrize("name", list(policies.REGISTRY))
def test_each_policy_picks_within_what_is_not_excluded(name: str) -> None:
    policy = policies.create()[name]
    endpoints = EPS
    key = pick.RequestKey(session="s", blocks=(1, 2, 3, 4))
    chosen, lacking = policy.pick("m", endpoints, load={}, key=key, exclude={"r0", "r1"})
    assert chosen is not None and chosen.replica_id == "r2" and lacking >= 0
    assert policy.pick("m", endpoints, key=key, exclude={"r0", "r1", "r2"})[0] is None


def test_a_policy_without_state_per_request_hands_out_no_ticket() -> None:
    """round_robin and the like: ``routed`` is None, so the hot path has nothing more to do."""
    for name in ("round_robin", "least_outstanding", "session_affinity"):
        assert policies.create()[name].routed("m", "vllm", "r0", 3, pick.NO_KEY, stream=True) is None


def test_prefix_cache_charges_a_routed_request_until_done() -> None:
    policy = policies.create()["prefix_cache"]
    assert isinstance(policy, policies.PrefixCache)
    ticket = policy.routed("m", "vllm", "r0", 3, pick.NO_KEY, stream=False)
    assert ticket is not None and not ticket.waits
    assert policy.cache.pending == {"r0": 3}
    policy.done(ticket)
    policy.done(ticket)  # once only
    assert policy.cache.pending == {}
    assert policy.routed("m", "vllm", "r0", 0, pick.NO_KEY, stream=False) is None  # nothing to charge or wait on


@pytest.mark.parametrize("name", list(policies.REGISTRY))
def test_a_policy_that_says_it_reads_no_load_picks_the_same_whatever_the_load(name: str) -> None:
    """``uses_load = False`` spares the router a map of every endpoint's load per request (issue 27); a policy
    whose picks the load moves must therefore say it reads it, or it would be handed ``NO_LOAD`` and pick blind."""
    heavy = {"r0": 50.0, "r1": 0.0, "r2": 50.0}
    light = {"r0": 0.0, "r1": 50.0, "r2": 0.0}
    key = pick.RequestKey(session="s", blocks=(1, 2))
    one, other = policies.create()[name], policies.create()[name]
    picks = [(ids([one.pick("m", EPS, load=heavy, key=key)[0]]), ids([other.pick("m", EPS, load=light, key=key)[0]]))
             for _ in range(6)]
    moved = any(a != b for a, b in picks)
    if not policies.REGISTRY[name].uses_load:
        assert not moved, (name, picks)
    if name == "least_outstanding":
        assert moved and policies.REGISTRY[name].uses_load
    if name == "round_robin":
        assert not policies.REGISTRY[name].uses_load
