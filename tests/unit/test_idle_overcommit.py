"""Over-commit across sleeping replicas (issue 31, --sleep-overcommit), with a real SQLite store, a stepped clock,
routers' reports given by hand and agents' links that record commands (as test_autoscaler_cluster.py): two
models on one GPU, one asleep while the other serves, alternate as each is wanted (least recently used)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw.control import loadreports
from llmgw.control.cluster import Cluster
from llmgw.control.reconcile import decide
from llmgw.control.state import Phase
from llmgw.control.store.store import Store, StoredNode
from llmgw.core import specs
from llmgw.core.inventory import Gpu, Inventory
from llmgw.core.shards import ShardState, ShardStatus
from llmgw.serving import config
from llmgw.serving.settings import ServerSettings
from llmgw.testing import stepped

GPU = Gpu(index=0, uuid="GPU-0", name="H100", memory_total_bytes=80 << 30, memory_used_bytes=0)
INV = Inventory(cpu_count=8, memory_total_bytes=64 << 30, memory_available_bytes=60 << 30, engines=(("sim", "1"),),
                gpus=(GPU,))


def model(name: str) -> specs.Model:
    return specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
                                 "spec": {"engine": "sim", "resources": {"gpus": {"count": 1}},
                                          "idle": {"after": "10s"}}})


class World:
    def __init__(self, tmp_path: Path, *, overcommit: float) -> None:
        self.store, self.clock = Store.open(tmp_path), stepped.Clock()
        self.signals = loadreports.RouterSignals(clock=self.clock, stale_after_s=1e9)
        self.c = Cluster(self.store, clock=self.clock, heartbeat_timeout_s=1e9, signals=self.signals,
                         cfg=decide.Config(node_grace_s=30, sleep_overcommit=overcommit))
        self.link = stepped.Link()
        self.c.node_registered(StoredNode("n1", "n1", "127.0.0.1", "0", INV, {}, 0.0, self.clock()), [], self.link)
        self.levels: dict[str, int] = {}

    def step(self, seconds: float = 1.0, **loads: dict[str, Any]) -> None:
        self.clock.now += seconds
        self.signals.record({"router": "r1", "interval_s": 2.0,
                             "models": [{"model": m, **kw} for m, kw in loads.items()]})
        while self.c.reconcile_once():
            pass

    def replica(self, name: str) -> Any:
        (r,) = [r for r in self.store.list_replicas() if r.model == name]
        return r

    def report(self, name: str, *, level: int) -> None:
        """The agent's report: Ready, its engine at ``level`` (0: awake)."""
        r = self.replica(name)
        self.levels[name] = level
        self.c.shard_reported("n1", ShardStatus(r.shard_id, r.id, ShardState.READY, endpoint=f"http://{r.id}",
                                                sleep_level=level))

    def sleeps_sent(self) -> list[str]:
        out = [what for verb, what in self.link.sent if verb == "sleep"]
        self.link.sent.clear()
        return out


def test_two_models_share_a_gpu_and_alternate(tmp_path: Path) -> None:
    w = World(tmp_path, overcommit=2.0)
    w.store.put_model(model("a"))
    w.step()
    a = w.replica("a")
    assert a.gpus == (0,)
    w.report("a", level=0)
    w.step()
    w.store.put_model(model("b"))
    w.step()
    assert w.replica("b").phase is Phase.PENDING  # the GPU is a's while it is awake
    # a idle past 10s: asleep; its GPU is lent to b.
    w.step(11)
    assert w.sleeps_sent() == [f"{a.shard_id}@1"]
    w.report("a", level=1)
    w.step()
    b = w.replica("b")
    assert b.phase is Phase.STARTING and b.gpus == (0,)
    w.report("b", level=0)
    w.step()
    # a is wanted while b serves: a waits, nothing is put to sleep under b's requests.
    w.step(1, a={"waiting": 1, "held": 1, "last_request_at": w.clock.now}, b={"in_flight": 2})
    assert w.sleeps_sent() == []
    # b goes quiet: b (least recently used, not busy) sleeps first, then a wakes once b is asleep.
    w.step(1, a={"waiting": 1, "held": 1, "last_request_at": w.clock.now})
    assert w.sleeps_sent() == [f"{b.shard_id}@1"]
    w.report("b", level=1)
    w.step(1, a={"waiting": 1, "held": 1, "last_request_at": w.clock.now})
    assert w.sleeps_sent() == [f"{a.shard_id}@0"]
    w.report("a", level=0)
    # And back: b wanted, a quiet: a sleeps, b wakes.
    w.step(1, b={"waiting": 1, "held": 1, "last_request_at": w.clock.now})
    assert w.sleeps_sent() == [f"{a.shard_id}@1"]
    w.report("a", level=1)
    w.step(1, b={"waiting": 1, "held": 1, "last_request_at": w.clock.now})
    assert w.sleeps_sent() == [f"{b.shard_id}@0"]
    events = [e.message for e in w.store.list_events(model="b") if e.reason == "Sleeping"]
    assert any("to wake" in m and "least recently used" in m for m in events), events


def test_without_overcommit_a_sleeping_replica_keeps_its_gpu(tmp_path: Path) -> None:
    w = World(tmp_path, overcommit=1.0)
    w.store.put_model(model("a"))
    w.step()
    w.report("a", level=0)
    w.step(11)
    w.report("a", level=1)
    w.store.put_model(model("b"))
    w.step()
    b = w.replica("b")
    assert b.phase is Phase.PENDING and "GPU 0" in b.message


def test_sleep_overcommit_is_checked_and_reaches_the_config(tmp_path: Path) -> None:
    for bad in (0.5, 9.0):
        with pytest.raises(ValueError, match=f"--sleep-overcommit {bad:g}: a factor from 1"):
            ServerSettings(sleep_overcommit=bad)
    cfg = config.config_of(ServerSettings(sleep_overcommit=2.0), {}, default_data_dir=tmp_path)
    assert cfg.sleep_overcommit == 2.0 and config.ServerConfig().sleep_overcommit == 1.0
