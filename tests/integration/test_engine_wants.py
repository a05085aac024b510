"""Engine wants through a real server: the Provision a node gets, its installs shown, and a replica waiting on one.

The node is a fake agent: a stream joined for real (a one-use token, mutual TLS with its own certificate) that
registers with the engines and installs the test says, reads the Provision the control plane sends, and reports
install states on its heartbeat, as the real agent's installer would (``llmgw.agent.provision``).
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from llmgw.agent import join as agent_join
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import skew
from llmgw.core.provision import EngineInstall, InstallState
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

CONNECT = "/llmgw.v1.AgentService/Connect"
INDEX = "http://127.0.0.1:9/wheels/"
GIB = 2**30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("engines"), server_args=["--engine-index", INDEX, "--engine-find-links"])
    try:
        s.start_server()
        yield s
    finally:
        s.close()


class FakeNode:
    """One node's agent stream: registers, heartbeats every second, and keeps every ControlMessage it is sent."""

    def __init__(self, s: System, node_id: str, state_dir: Path, *, pool: str,
                 engines: list[tuple[str, str]], installs: tuple[EngineInstall, ...] = ()) -> None:
        self.node_id, self.engines, self.installs = node_id, list(engines), installs
        joined = agent_join.join(server=f"127.0.0.1:{s.join_port}", token=s.join_token(), ca_hash=s.ca_hash,
                                 node_id=node_id, state_dir=state_dir)
        ca, cert, key = joined.pki.credentials()
        self.channel = grpc.secure_channel(f"127.0.0.1:{s.agent_port}", grpc.ssl_channel_credentials(ca, key, cert))
        self._out: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self.got: list[pb.ControlMessage] = []
        self._seq = 1
        connect = self.channel.stream_stream(CONNECT, request_serializer=pb.AgentMessage.SerializeToString,
                                             response_deserializer=pb.ControlMessage.FromString)
        self._replies = connect(iter(self._out.get, None))
        self._out.put(pb.AgentMessage(seq=1, register=pb.Register(
            node_id=node_id, hostname=node_id, labels={"pool": pool}, mgmt_addr="127.0.0.1", protocol=skew.PROTOCOL,
            inventory=pb.Inventory(cpu_count=8, memory_total_bytes=16 * GIB, memory_available_bytes=16 * GIB),
            engines=[pb.EngineInfo(name=n, version=v) for n, v in engines],
            installs=convert.installs_to_pb(installs))))
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._beater = threading.Thread(target=self._beat, daemon=True)
        self._beater.start()

    def _read(self) -> None:
        try:
            for msg in self._replies:
                self.got.append(msg)
        except grpc.RpcError:
            pass

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            self.report()

    def report(self, installs: tuple[EngineInstall, ...] | None = None,
               engines: list[tuple[str, str]] | None = None) -> None:
        """A heartbeat carrying the installs and engines as they are now (changed ones if given)."""
        if installs is not None:
            self.installs = installs
        if engines is not None:
            self.engines = engines
        self._seq += 1
        self._out.put(pb.AgentMessage(seq=self._seq, heartbeat=pb.Heartbeat(
            memory_total_bytes=16 * GIB, memory_available_bytes=16 * GIB,
            installs_changed=True, installs=convert.installs_to_pb(self.installs),
            engines_changed=True, engines=[pb.EngineInfo(name=n, version=v) for n, v in self.engines])))

    def provisions(self) -> list[pb.Provision]:
        return [m.provision for m in list(self.got) if m.WhichOneof("body") == "provision"]

    def close(self) -> None:
        self._stop.set()
        self._out.put(None)
        self.channel.close()


@pytest.fixture
def fake(cluster: System, tmp_path: Path) -> Iterator[Callable[..., FakeNode]]:
    opened: list[FakeNode] = []

    def open_node(pool: str = "cpu", engines: list[tuple[str, str]] | None = None,
                  installs: tuple[EngineInstall, ...] = ()) -> FakeNode:
        node_id = f"fake-{uuid.uuid4().hex[:6]}"
        opened.append(FakeNode(cluster, node_id, tmp_path / node_id, pool=pool,
                               engines=engines if engines is not None else [("sim", "0.1")], installs=installs))
        wait_for(lambda: _node(cluster, node_id).get("connected"), timeout=10, what=f"{node_id} connected")
        return opened[-1]

    try:
        yield open_node
    finally:
        for n in opened:
            n.close()


def _node(s: System, node_id: str) -> dict[str, Any]:
    return next((n for n in s.get("/api/v1/nodes")["items"] if n["id"] == node_id), {})


def _cli(s: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMGW, *args, "--url", s.url], capture_output=True, text=True, timeout=60,
                          env={**s.cli_env(), "COLUMNS": "400"}, check=False)


def _wanted(node: FakeNode) -> list[tuple[str, str]] | None:
    got = node.provisions()
    return [(w.engine, w.version) for w in got[-1].wants] if got else None


def test_a_want_reaches_its_node_with_the_index_and_its_install_shows(cluster: System,
                                                                      fake: Callable[..., FakeNode]) -> None:
    """`engine install NODE` sends it a Provision with the index; its install shows in get/describe/list."""
    a, b = fake(), fake()
    done = _cli(cluster, "engine", "install", a.node_id, "vllm", "0.11.2")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: _wanted(a) == [("vllm", "0.11.2")], timeout=10, what="the Provision on node a")
    p = a.provisions()[-1]
    assert p.index_url == INDEX and p.find_links and not p.remove
    assert b.provisions() == []  # nothing wanted there, nothing installed: nothing sent
    a.report(installs=(EngineInstall("vllm", "0.11.2", "cpu", InstallState.Installing, message="downloading",
                                     bytes_done=350_000_000, bytes_total=1_000_000_000,
                                     missing_os_packages=("libnuma1",),
                                     os_install_command="apt-get install -y libnuma1"),))
    wait_for(lambda: "Installing 35%" in _cli(cluster, "get", "nodes", "-o", "wide").stdout, timeout=10,
             what="the install in get nodes -o wide")
    wide = _cli(cluster, "get", "nodes", "-o", "wide").stdout
    assert "vllm 0.11.2 cpu Installing 35%" in wide and "cpu" in wide, wide
    described = _cli(cluster, "describe", "node", a.node_id)
    assert described.returncode == 0, described.stderr
    assert "Engines (installed by llmgw):" in described.stdout, described.stdout
    assert "downloading" in described.stdout
    assert "lacks OS packages libnuma1; run as root: apt-get install -y libnuma1" in described.stdout
    listed = _cli(cluster, "engine", "list")
    assert f"node:{a.node_id}" in listed.stdout and "Installing 35%" in listed.stdout, listed.stdout
    assert INDEX in listed.stdout
    # The same again changes nothing and says so.
    again = _cli(cluster, "engine", "install", a.node_id, "vllm", "0.11.2")
    assert again.returncode == 0 and "already wanted" in again.stdout, again.stdout
    # Failing is an event on the node, in pip's words.
    a.report(installs=(EngineInstall("vllm", "0.11.2", "cpu", InstallState.Failed,
                                     message="No matching distribution found for vllm==0.11.2"),))

    def failed_event() -> bool:
        events = cluster.get(f"/api/v1/nodes/{a.node_id}/describe")["events"]
        return any(e["reason"] == "EngineInstallFailed" and e["message"] == f"Failed: vllm 0.11.2 on {a.node_id}: "
                   "No matching distribution found for vllm==0.11.2" for e in events)
    wait_for(failed_event, timeout=10, what="the EngineInstallFailed event")


def test_a_pool_want_reaches_every_node_of_the_pool_and_only_those(cluster: System,
                                                                   fake: Callable[..., FakeNode]) -> None:
    """`engine install --pool P` reaches the pool's nodes; a node of another pool gets nothing."""
    pool = f"p{uuid.uuid4().hex[:6]}"
    a, b, other = fake(pool=pool), fake(pool=pool), fake(pool="elsewhere")
    done = _cli(cluster, "engine", "install", "--pool", pool, "llamacpp", "0.2.0")
    assert done.returncode == 0, done.stderr
    for n in (a, b):
        wait_for(lambda n=n: _wanted(n) == [("llamacpp", "0.2.0")], timeout=10, what=f"Provision on {n.node_id}")
    time.sleep(1.5)  # a pass or two: the node of another pool must still have nothing
    assert other.provisions() == []
    gone = _cli(cluster, "engine", "forget", "--pool", pool, "llamacpp", "0.2.0")
    assert gone.returncode == 0, gone.stderr
    wait_for(lambda: _wanted(a) == [], timeout=10, what="the want dropped from node a's Provision")


def test_a_model_makes_a_node_install_its_engine_and_its_replica_waits_then_starts(
        cluster: System, fake: Callable[..., FakeNode]) -> None:
    """A model's engine_version is wanted where it lacks; the replica says the install's sentence, then starts."""
    pool = f"p{uuid.uuid4().hex[:6]}"
    a = fake(pool=pool)
    name = f"needs-{uuid.uuid4().hex[:6]}"
    cluster.apply(sim_model(name, engine_version="9.9", pool=pool))
    try:
        wait_for(lambda: _wanted(a) == [("sim", "9.9")], timeout=10, what="the model's want on node a")
        a.report(installs=(EngineInstall("sim", "9.9", "py", InstallState.Installing, message="downloading",
                                         bytes_done=500_000_000, bytes_total=1_000_000_000),))

        def waiting() -> str | None:
            msg = cluster.model_status(name)["message"]
            return msg if f"Installing sim 9.9 on {a.node_id}: downloading 0.5/1.0 GB" in msg else None
        wait_for(waiting, timeout=10, what="the install's sentence in the model's message")
        a.report(installs=(EngineInstall("sim", "9.9", "py", InstallState.Ready),),
                 engines=[("sim", "0.1"), ("sim", "9.9")])
        wait_for(lambda: any(m.WhichOneof("body") == "start_shard" for m in list(a.got)), timeout=15,
                 what="StartShard on node a once the install is Ready")
        start = next(m.start_shard for m in a.got if m.WhichOneof("body") == "start_shard")
        assert start.spec.model == name or name in start.spec.replica_id, start
        # Removing it now is refused: the replica may run it, and the refusal names it.
        rid = cluster.replicas(name)[0]["id"]
        refused = _cli(cluster, "engine", "remove", a.node_id, "sim", "9.9")
        assert refused.returncode == 1
        assert f"sim 9.9 may be in use by replica {rid} on {a.node_id}" in refused.stderr, refused.stderr
    finally:
        cluster.request("DELETE", f"/api/v1/models/{name}")


def test_remove_sends_the_removal_and_drops_the_want(cluster: System, fake: Callable[..., FakeNode]) -> None:
    """`engine remove NODE` drops the want and sends Provision.remove to the node; it is audited."""
    a = fake()
    assert _cli(cluster, "engine", "install", a.node_id, "sglang", "0.5.1").returncode == 0
    wait_for(lambda: _wanted(a) == [("sglang", "0.5.1")], timeout=10, what="the want on node a")
    done = _cli(cluster, "engine", "remove", a.node_id, "sglang", "0.5.1")
    assert done.returncode == 0 and f"removing sglang 0.5.1 on {a.node_id}" in done.stdout, (done.stdout, done.stderr)

    def removal() -> pb.Provision | None:
        return next((p for p in a.provisions() if p.remove), None)
    got = wait_for(removal, timeout=10, what="a Provision with remove")
    assert [(w.engine, w.version) for w in got.remove] == [("sglang", "0.5.1")]
    assert [(w.engine, w.version) for w in got.wants] == []  # the want is gone before the removal is sent
    assert not any(w["scope"] == f"node:{a.node_id}" for w in cluster.get("/api/v1/engines")["wants"])
    objects = [e["object"] for e in cluster.get("/api/v1/audit")["items"] if e["action"] == "engine remove"]
    assert f"engine/sglang 0.5.1 on {a.node_id}" in objects, objects


def test_refusals_say_why_and_what_to_do(cluster: System, fake: Callable[..., FakeNode]) -> None:
    """An unknown engine or node, a bad version, an empty pool, and a removal a pool want would undo: each refused."""
    pool = f"p{uuid.uuid4().hex[:6]}"
    a = fake(pool=pool)
    cases = [
        (["install", a.node_id, "torchserve", "1.0"], "engine 'torchserve' is not one llmgw runs; choose one of"),
        (["install", "no-such-node", "vllm", "0.11.2"], "node 'no-such-node' is not known; `llmgw get nodes`"),
        (["install", a.node_id, "vllm", "latest"], "version 'latest' is not a version such as 0.11.2"),
        (["remove", "--pool", "empty-pool", "vllm", "0.11.2"], "no node is in pool 'empty-pool'"),
        (["install", a.node_id, "vllm"], "give NODE ENGINE VERSION (or --pool POOL ENGINE VERSION)"),
        (["forget", a.node_id, "vllm", "0.0.1"], f"vllm 0.0.1 is not wanted on node {a.node_id}"),
    ]
    for args, words in cases:
        done = _cli(cluster, "engine", *args)
        assert done.returncode == 1 and words in done.stderr, (args, done.stderr)
    assert _cli(cluster, "engine", "install", "--pool", pool, "vllm", "0.11.2").returncode == 0
    kept = _cli(cluster, "engine", "remove", a.node_id, "vllm", "0.11.2")
    assert kept.returncode == 1, kept.stdout
    assert (f"vllm 0.11.2 is wanted on {a.node_id} by its pool {pool}'s want, and would be installed again; "
            f"remove it there with `llmgw engine remove --pool {pool} vllm 0.11.2`") in kept.stderr, kept.stderr
    assert _cli(cluster, "engine", "remove", "--pool", pool, "vllm", "0.11.2").returncode == 0
