"""Garbage collection of fetched weights: only llmgw's, only unwanted, least recently used first, to the threshold."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from test_placement_data import GIB, node, spec

from llmgw.control.reconcile import decide, weightsgc
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import NodeView
from llmgw.core import sources
from llmgw.core.inventory import ModelDir, WeightFile
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

CACHE = "/var/lib/llmgw/weights"
NOW = 1_000_000.0


def fetched(source: str, size_gib: float, last_used: float) -> WeightFile:
    name = sources.parse(source).cache_name()
    return WeightFile(f"{CACHE}/{name}", int(size_gib * GIB), "safetensors", fetched_by_llmgw=True, source=source,
                      last_used_unix=int(last_used), cache_name=name)


def disk_node(nid: str, free_gib: float, *weights: WeightFile, total_gib: float = 100) -> NodeView:
    v = node(nid, weights=weights)
    inv = dataclasses.replace(v.inventory, model_dirs=(ModelDir(CACHE, int(total_gib * GIB), int(free_gib * GIB)),))
    return dataclasses.replace(v, inventory=inv)


def removed(out: list[d.Decision]) -> list[tuple[str, str]]:
    return [(c.node_id, c.cache_name) for c in out if isinstance(c, d.RemoveWeights)]


OLD, MID, NEW = (fetched(f"hf://org/{n}", 3, NOW - age) for n, age in (("old", 9000), ("mid", 900), ("new", 9)))


def test_least_recently_used_go_first_until_above_the_threshold() -> None:
    """5% free of 100 GiB, 10% wanted: the oldest two (3 GiB each) go, the newest stays."""
    out = weightsgc.collect({}, [disk_node("a", 5, NEW, OLD, MID)], free_below_pct=10, now=NOW)
    assert removed(out) == [("a", OLD.cache_name), ("a", MID.cache_name)]
    (event, _) = [c.event for c in out if isinstance(c, d.RecordEvent)]
    assert event.reason == weightsgc.REMOVED_REASON and event.object == "node/a"
    assert event.message.startswith(f"{CACHE} on node a has 5.0% free, below 10%: removing {OLD.cache_name} "
                                    "(3.0 GiB, from hf://org/old), which no model asks for and no replica uses, "
                                    "last used 2h ago")


def test_nothing_goes_above_the_threshold_or_when_off() -> None:
    """A node with 10% free or more, or a threshold of 0, keeps everything."""
    assert weightsgc.collect({}, [disk_node("a", 10, OLD)], free_below_pct=10, now=NOW) == []
    assert weightsgc.collect({}, [disk_node("a", 1, OLD)], free_below_pct=0, now=NOW) == []


def test_weights_a_model_asks_for_are_never_removed() -> None:
    """The source of a model that exists (running or not) keeps its weights, however old."""
    out = weightsgc.collect({"old": spec(source="hf://org/old")}, [disk_node("a", 1, OLD, MID)],
                            free_below_pct=10, now=NOW)
    assert removed(out) == [("a", MID.cache_name)]


def test_weights_a_shard_on_the_node_uses_are_never_removed() -> None:
    """A shard still running (its model deleted, its engine not stopped yet) keeps the weights it was started on."""
    shard = ShardStatus("x-1", "x", ShardState.READY, spec=ShardSpec("x-1", "x", "gone", "sim", "m", source=OLD.source))
    v = dataclasses.replace(disk_node("a", 1, OLD, MID), shards={"x-1": shard})
    assert removed(weightsgc.collect({}, [v], free_below_pct=10, now=NOW)) == [("a", MID.cache_name)]
    stopped = dataclasses.replace(shard, state=ShardState.STOPPED)
    v = dataclasses.replace(v, shards={"x-1": stopped})
    assert removed(weightsgc.collect({}, [v], free_below_pct=50, now=NOW))[0] == ("a", OLD.cache_name)


def test_only_weights_llmgw_fetched_are_candidates() -> None:
    """A directory someone copied by hand (not fetched by llmgw, no cache name) is never asked for."""
    by_hand = WeightFile(f"{CACHE}/mine", 50 * GIB, "safetensors")
    assert weightsgc.collect({}, [disk_node("a", 1, by_hand)], free_below_pct=10, now=NOW) == []


def test_removals_already_asked_count_and_are_not_asked_again() -> None:
    """A removal sent and still listed counts as freed: the pass neither repeats it nor takes another for its room."""
    out = weightsgc.collect({}, [disk_node("a", 8, OLD, MID)], free_below_pct=10, now=NOW,
                            removing=frozenset({("a", OLD.cache_name)}))
    assert removed(out) == []


def test_nodes_not_reported_are_left_alone() -> None:
    """A node this control plane has not heard from since it started is not collected on its stored inventory."""
    v = dataclasses.replace(disk_node("a", 1, OLD), reported=False)
    assert weightsgc.collect({}, [v], free_below_pct=10, now=NOW) == []


def test_a_pass_decides_removals_with_its_threshold() -> None:
    """reconcile() returns the RemoveWeights of its pass, by the configured threshold."""
    nodes = {"a": disk_node("a", 5, OLD)}
    assert removed(decide.reconcile({}, [], nodes, now=NOW)) == [("a", OLD.cache_name)]
    assert removed(decide.reconcile({}, [], nodes, now=NOW, cfg=decide.Config(weights_gc_free_below_pct=4))) == []


def test_the_weights_listing_names_the_models_asking_for_fetched_weights() -> None:
    """`llmgw get weights`' rows: fetched weights matched to models by source, the remote reads with their sizes."""
    from llmgw.control.http import weights as weights_http
    from llmgw.control.placement import fit

    models = {"old": spec(source="hf://org/old"), "other": spec(source="hf://org/other")}
    remote = {"hf://org/other": fit.RemoteWeights(None, "HTTP 404")}
    doc = weights_http.weights_doc(models, [disk_node("a", 5, OLD, MID)], remote)
    assert [(r["node"], r["cache_name"], r["models"], r["fetched_by_llmgw"]) for r in doc["items"]] == [
        ("a", MID.cache_name, [], True), ("a", OLD.cache_name, ["old"], True)]
    assert doc["remote"] == [{"source": "hf://org/other", "size_bytes": None, "problem": "HTTP 404",
                              "models": ["other"]}]


def test_the_control_plane_sends_each_removal_once_until_the_node_stops_listing_it(tmp_path: Path) -> None:
    """RemoveWeights reaches the node's link once; not again while listed; the event is stored with its reason."""
    from llmgw.control.cluster import Cluster
    from llmgw.control.store.store import Store, StoredNode
    from llmgw.core.inventory import Heartbeat
    from llmgw.testing import stepped

    store, clock, link = Store.open(tmp_path), stepped.Clock(), stepped.Link()
    try:
        c = Cluster(store, clock=clock, heartbeat_timeout_s=1e9)
        inv = disk_node("a", 5, OLD, MID).inventory
        c.node_registered(StoredNode("a", "a", "127.0.0.1", "0", inv, {}, 0.0, clock()), [], link)
        c.reconcile_once()
        assert link.sent == [("remove_weights", OLD.cache_name), ("remove_weights", MID.cache_name)]
        c.reconcile_once()
        assert len(link.sent) == 2  # still listed, asked already: not again, and nothing more taken
        # The node's next report no longer lists them, and has room: nothing more is asked.
        c.node_heartbeat("a", Heartbeat(inv.memory_total_bytes, inv.memory_available_bytes, weights=(),
                                        model_dirs=(dataclasses.replace(inv.model_dirs[0], free_bytes=11 * GIB),)))
        c.reconcile_once()
        assert len(link.sent) == 2
        assert [e.reason for e in store.list_events()].count(weightsgc.REMOVED_REASON) == 2
    finally:
        store.close()
