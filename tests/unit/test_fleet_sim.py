"""The fleet simulator (its pure parts, and following a standby's refusal to the leader against real gRPC servers),
the agent service's wait histogram and GC freezing, heartbeat expiry."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.core import HistogramMetricFamily

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.control.agentsvc import collector, metrics
from llmgw.control.cluster import Cluster
from llmgw.control.store.store import Store, StoredNode
from llmgw.core.inventory import Heartbeat
from llmgw.sim import fleet


def _buckets(h: metrics.WaitHistogram) -> dict[str, float]:
    (family,) = list(h.collect())
    assert isinstance(family, HistogramMetricFamily)
    return {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}


def test_wait_histogram_counts_an_idle_sleep_as_waits_of_zero() -> None:
    """A probe that woke on time adds one zero-wait arrival per millisecond slept, nothing above."""
    h = metrics.WaitHistogram()
    h.add(0.005, 0.0)
    b = _buckets(h)
    assert b["1e-05"] == pytest.approx(5.0)
    assert b["+Inf"] == pytest.approx(5.0)


def test_wait_histogram_weights_a_stall_by_its_length() -> None:
    """A one-second stall is a thousand arrivals, waiting evenly from 1 s down to 0: half wait under 0.5 s."""
    h = metrics.WaitHistogram()
    h.add(0.005, 1.0)
    b = _buckets(h)
    assert b["+Inf"] == pytest.approx(1005.0)
    assert b["0.5"] - b["1e-05"] == pytest.approx(500.0 - 0.01)
    assert b["1.0"] == pytest.approx(1005.0)
    (family,) = list(h.collect())
    total = next(s.value for s in family.samples if s.name.endswith("_sum"))
    assert total == pytest.approx(500.0)  # 1000 arrivals waiting 0.5 s on average


def test_wait_histogram_puts_a_stall_past_the_last_bucket_in_inf() -> None:
    """Waits longer than the last bucket still count, in +Inf only."""
    h = metrics.WaitHistogram()
    h.add(0.0, 12.0)
    b = _buckets(h)
    assert b["10.0"] == pytest.approx(10_000.0)
    assert b["+Inf"] == pytest.approx(12_000.0)


def test_freeze_moves_survivors_out_of_collection() -> None:
    """After a freeze, objects alive then are in the permanent generation; a full one first unfreezes."""
    keep = [[i] for i in range(1000)]
    try:
        collector.note_registration()
        collector.freeze(full=False)
        assert gc.get_freeze_count() >= len(keep)
        assert collector._registered[0] == 0
        collector.freeze(full=True)
        assert gc.get_freeze_count() >= len(keep)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_no_automatic_full_collection_walks_promoted_objects() -> None:
    """Under the policy, young collections promote survivors but Python starts no full collection itself."""
    saved = gc.get_threshold()
    started: list[int] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(info["generation"])

    try:
        gc.set_threshold(50, 2, saved[2])  # young collections every 50 survivors: many promotions, quickly
        collector.no_automatic_full()
        gc.callbacks.append(on_gc)
        keep = [[] for _ in range(300_000)]  # each survives its young collections into the oldest generation
        gc.callbacks.remove(on_gc)
        assert len(keep) == 300_000 and started.count(1) >= 1000
        assert 2 not in started
    finally:
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
        gc.set_threshold(*saved)


def test_heartbeat_bytes_parse_as_one_message_with_the_seq() -> None:
    """The seq prefix joined to the prebuilt heartbeat is one AgentMessage carrying both."""
    agents = fleet.build_fleet(4, fleet.parse_mix("h100:1"), heartbeat_s=5, stats=fleet.Stats())
    a = agents[0]
    data = pb.AgentMessage(seq=42).SerializeToString() + a._tail
    msg = pb.AgentMessage.FromString(data)
    assert msg.seq == 42 and msg.WhichOneof("body") == "heartbeat"
    assert len(msg.heartbeat.gpus) == 8
    assert msg.heartbeat.memory_available_bytes == a.inventory.memory_available_bytes


def test_fleet_spreads_heartbeats_evenly_over_the_period() -> None:
    """Node i of n beats at i/n of the period, so the server sees a steady rate."""
    agents = fleet.build_fleet(4, fleet.parse_mix("cpu:1"), heartbeat_s=5, stats=fleet.Stats())
    assert [a.phase for a in agents] == [0.0, 0.25, 0.5, 0.75]


def test_lateness_lands_in_its_bucket() -> None:
    """A beat 3 ms late counts under 5 ms; one later than the last bound counts above it."""
    s = fleet.Stats()
    s.count_late(0.003)
    s.count_late(60.0)
    assert s.late[fleet.LATE_BUCKETS.index(0.005)] == 1
    assert s.late[-1] == 1 and sum(s.late) == 2


@pytest.mark.parametrize(("mix", "error"), [
    ("gpu:1", "unknown node kind 'gpu'"),
    ("h100:lots", "the weight must be a number"),
    ("h100:-1", "must not be negative"),
    ("h100:0,cpu:0", "at least one weight must be above 0"),
])
def test_bad_mix_says_what_is_wrong(mix: str, error: str) -> None:
    """Each malformed --mix is refused with what to fix."""
    with pytest.raises(ValueError, match=error):
        fleet.parse_mix(mix)


class _Link:
    def __init__(self) -> None:
        self.closed: list[str] = []

    def start_shard(self, spec: Any) -> None: ...
    def stop_shard(self, shard_id: str, *, reason: str) -> None: ...
    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None: ...

    def close(self, reason: str) -> None:
        self.closed.append(reason)

    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> tuple[str, asyncio.Queue[Any]]:
        raise NotImplementedError

    def cancel_logs(self, request_id: str) -> None: ...


def test_only_the_silent_node_is_expired(tmp_path: Path) -> None:
    """A pass closes the stream of the node silent past the timeout and leaves the one that beat."""
    now = [1000.0]
    store = Store.open(tmp_path)
    try:
        c = Cluster(store, clock=lambda: now[0], heartbeat_timeout_s=20.0)
        inv = fleet.KINDS["cpu"]
        links = {name: _Link() for name in ("quiet", "beating")}
        for name, link in links.items():
            c.node_registered(StoredNode(name, name, "", "", inv, {}, now[0], now[0]), [], link)
        now[0] += 15
        c.node_heartbeat("beating", Heartbeat(inv.memory_total_bytes, inv.memory_available_bytes))
        now[0] += 10  # quiet: 25 s silent; beating: 10 s
        c.reconcile_once()
        assert links["quiet"].closed == ["no heartbeat"] and not c.connected("quiet")
        assert links["beating"].closed == [] and c.connected("beating")
    finally:
        store.close()


# Far longer than any test waits: a node that slept before following a refusal would hang the test here.
SLEEP_S = 600.0
GUARD_S = 30.0


class _Control(agent_pb2_grpc.AgentServiceServicer):
    """A control plane: accepts and sends ``commands`` (a leader), or refuses naming ``leader`` (a standby)."""

    def __init__(self, *, ok: bool, leader: str = "") -> None:
        self.ok, self.leader = ok, leader
        self.registers: list[str] = []
        self.registered = asyncio.Event()
        self.commands: list[pb.ControlMessage] = []
        #: Set when the node answered a command (a shard status).
        self.answered = asyncio.Event()

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        first = await anext(request_iterator)
        self.registers.append(first.register.node_id)
        self.registered.set()
        yield pb.ControlMessage(ack=pb.Ack(seq=first.seq, ok=self.ok, leader=self.leader,
                                           error="" if self.ok else "this control plane is a standby"))
        if not self.ok:
            return
        for msg in self.commands:
            yield msg
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "shard_status":
                self.answered.set()


async def _serve(stack: contextlib.AsyncExitStack, servicer: _Control) -> str:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, 0)
    return f"127.0.0.1:{port}"


async def _fleet(stack: contextlib.AsyncExitStack, servers: tuple[str, ...], *, retry_s: float) -> fleet.Stats:
    """One simulated node against ``servers`` until the test ends (``retry_s``: its sleep before the next)."""
    stats = fleet.Stats()
    agents = fleet.build_fleet(1, fleet.parse_mix("cpu:1"), heartbeat_s=SLEEP_S, stats=stats)
    agents[0].retry_s = retry_s
    stop = asyncio.Event()
    task = asyncio.create_task(fleet.run(servers, agents, stop=stop, report_s=SLEEP_S))

    async def end() -> None:
        stop.set()
        await asyncio.wait_for(task, GUARD_S)

    stack.push_async_callback(end)
    return stats


def test_a_refusal_naming_a_given_leader_is_followed_at_once() -> None:
    """A standby (the first server) refuses naming the third: the node registers there without its retry sleep,
    skipping the second, and the commands it then receives are counted."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            leader, other = _Control(ok=True), _Control(ok=True)
            leader.commands.append(pb.ControlMessage(seq=1, start_shard=pb.StartShard(spec=pb.ShardSpec(
                shard_id="m-0", replica_id="m-0", model="m", engine="sim"))))
            other_addr, leader_addr = await _serve(stack, other), await _serve(stack, leader)
            standby = _Control(ok=False, leader=leader_addr)
            stats = await _fleet(stack, (await _serve(stack, standby), other_addr, leader_addr), retry_s=SLEEP_S)
            await asyncio.wait_for(leader.registered.wait(), GUARD_S)
            await asyncio.wait_for(leader.answered.wait(), GUARD_S)
            assert standby.registers == ["sim-00000"] and leader.registers == ["sim-00000"]
            assert other.registers == [] and stats.redirects == 1 and stats.registered == 1
            assert stats.starts == 1

    asyncio.run(main())


@pytest.mark.parametrize("named", ["", "unknown"])
def test_a_refusal_without_a_given_leader_moves_to_the_next_server(named: str) -> None:
    """A refusal naming no leader, or one not among the given servers, sends the node to the next server in the
    list (after its sleep), not to the named address."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            second, third = _Control(ok=True), _Control(ok=True)
            second_addr, third_addr = await _serve(stack, second), await _serve(stack, third)
            standby = _Control(ok=False, leader="127.0.0.1:1" if named else "")
            stats = await _fleet(stack, (await _serve(stack, standby), second_addr, third_addr), retry_s=0.01)
            await asyncio.wait_for(second.registered.wait(), GUARD_S)
            assert third.registers == [] and stats.redirects == 0

    asyncio.run(main())


def test_two_standbys_naming_each_other_do_not_spin() -> None:
    """A followed leader that refuses naming the first again is not followed at once a second time: the node
    sleeps before it dials again, so two stale standbys cannot make it spin."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            b = _Control(ok=False)
            b_addr = await _serve(stack, b)
            a = _Control(ok=False, leader=b_addr)
            a_addr = await _serve(stack, a)
            b.leader = a_addr
            stats = await _fleet(stack, (a_addr, b_addr), retry_s=SLEEP_S)
            await asyncio.wait_for(b.registered.wait(), GUARD_S)
            for _ in range(50):  # many turns of the loop: a node that did not sleep would dial A again
                await asyncio.sleep(0.01)
            assert a.registers == ["sim-00000"] and b.registers == ["sim-00000"] and stats.redirects == 1

    asyncio.run(main())


@pytest.mark.parametrize(("text", "error"), [
    ("127.0.0.1", "not HOST:PORT"),
    ("127.0.0.1:0", "not HOST:PORT"),
    ("127.0.0.1:8081,:9", "':9' is not HOST:PORT"),
])
def test_bad_server_list_says_what_is_wrong(text: str, error: str) -> None:
    """Each malformed --server list is refused naming the bad address."""
    with pytest.raises(ValueError, match=error):
        fleet.parse_servers(text)


def test_server_list_keeps_order_and_drops_repeats() -> None:
    """``A,B,A`` is A then B."""
    assert fleet.parse_servers("127.0.0.1:2, 127.0.0.1:1,127.0.0.1:2") == ("127.0.0.1:2", "127.0.0.1:1")
