"""Engine wants and settings in the store, and the server flags over the stored settings (a flag given wins)."""

from __future__ import annotations

from pathlib import Path

from llmgw.control import engines
from llmgw.control.cluster import Cluster
from llmgw.control.loop.planner import Observed
from llmgw.control.reconcile import engines as prov
from llmgw.control.store.store import Store, StoredNode
from llmgw.core.inventory import Inventory
from llmgw.core.provision import EngineWant
from llmgw.testing import stepped

INV = Inventory(cpu_count=8, memory_total_bytes=16 << 30, memory_available_bytes=12 << 30, engines=(("sim", "1"),))


def test_wants_are_stored_once_listed_and_deleted(tmp_path: Path) -> None:
    """A want is stored once (a repeat says so), survives a reopen, and is deleted by scope, engine and version."""
    store = Store.open(tmp_path)
    want = prov.ScopedWant("node:a", "vllm", "0.11.2", 5.0)
    assert store.add_engine_want(want) and not store.add_engine_want(want)
    assert store.add_engine_want(prov.ScopedWant("pool:gpu", "vllm", "0.11.2", 6.0))
    store.close()
    store = Store.open(tmp_path)
    assert store.list_engine_wants() == [want, prov.ScopedWant("pool:gpu", "vllm", "0.11.2")]
    assert store.list_engine_wants()[0].created_at == 5.0
    assert store.delete_engine_want("node:a", "vllm", "0.11.2") and not store.delete_engine_want("node:a", "vllm",
                                                                                                "0.11.2")
    assert [w.scope for w in store.list_engine_wants()] == ["pool:gpu"]
    store.close()


def test_a_flag_given_wins_and_is_stored_one_not_given_keeps_the_stored_value(tmp_path: Path) -> None:
    """A server flag given overrides the stored setting and is kept; without flags the stored settings stand."""
    store = Store.open(tmp_path)
    cluster = Cluster(store)
    got = engines.apply_server_flags(store, cluster, index_url="http://mirror:8080/wheels/", find_links=True,
                                     models_trigger_installs=False)
    assert got == prov.EngineSettings(index_url="http://mirror:8080/wheels/", find_links=True,
                                      models_trigger_installs=False)
    assert cluster.engine_settings == got
    # The next start, without flags: what was stored.
    again = Cluster(store)
    assert again.engine_settings == got
    assert engines.apply_server_flags(store, again) == got
    # A new index without --engine-find-links is a simple index; models stay as stored.
    assert engines.apply_server_flags(store, again, index_url="http://pypi.internal/simple", find_links=False) == \
        prov.EngineSettings(index_url="http://pypi.internal/simple", models_trigger_installs=False)
    assert engines.apply_server_flags(store, again, models_trigger_installs=True).models_trigger_installs
    # --engine-os-packages: off unless given, then kept.
    assert not again.engine_settings.os_packages
    assert engines.apply_server_flags(store, again, os_packages=True).os_packages
    assert engines.apply_server_flags(store, again).os_packages
    store.close()


def test_a_provision_worked_out_before_a_want_changed_is_not_sent(tmp_path: Path) -> None:
    """A pass whose plan predates a want's change sends nothing (it could undo a removal); the next pass sends."""
    store, clock, link = Store.open(tmp_path), stepped.Clock(), stepped.Link()
    c = Cluster(store, clock=clock, heartbeat_timeout_s=1e9)
    c.node_registered(StoredNode("a", "a", "127.0.0.1", "0", INV, {}, 0.0, clock()), [], link)
    c.engine_wants = (prov.ScopedWant("node:a", "vllm", "0.11.2"),)
    plan = c.planner.plan({}, [], dict(c.nodes), frozenset(), now=clock(), seen=Observed(ejected={}))
    c.engine_wants = (prov.ScopedWant("node:a", "vllm", "0.12.0"),)  # changed while that pass ran
    c._apply(plan)
    assert link.sent == []
    c.reconcile_once()
    assert [(verb, p.wants) for verb, p in link.sent] == [("provision", (EngineWant("vllm", "0.12.0"),))]
    c.reconcile_once()
    assert len(link.sent) == 1  # unchanged: not sent again
    store.close()
