"""Bad input against the real processes: each case a clear error, nothing harmed, nothing lost.

One server with one agent (node1) serves the whole module; every case checks,
besides its refusal, that the server still answers, node1's stream was never
touched and nothing was stored or created. Covered elsewhere, not repeated here:
log requests with `..`, absolute paths, NUL and the like (test_logs_traversal.py,
at the REST route and at the agent), and weight removals of `../x`, a path, a
hand-copied directory and a symlink out of the cache (test_weights_cluster.py).
"""

from __future__ import annotations

import json
import queue
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml

from llmgw.agent import join as agent_join
from llmgw.agent import nodepki
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import skew
from llmgw.testing import system as system_mod
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

CONNECT = "/llmgw.v1.AgentService/Connect"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with system_mod.running(tmp_path_factory.mktemp("bad")) as s:
        yield s


def _unharmed(s: System) -> None:
    """The server answers, node1 is connected on the stream it opened first, and no model was stored."""
    assert s.get("/healthz") == {"status": "ok"}
    node1 = [n for n in s.get("/api/v1/nodes")["items"] if n["id"] == "node1"]
    assert node1 and node1[0]["connected"], node1
    agent_log = (s.root / "agent-node1.log").read_text()
    assert agent_log.count("registered with") == 1, agent_log[-2000:]
    assert "closed the stream" not in agent_log and "refused this agent" not in agent_log, agent_log[-2000:]


def _server_log(s: System) -> str:
    return (s.root / "server.log").read_text()


class _RawStream:
    """An agent stream that sends whatever bytes it is given, as a hostile or broken peer would."""

    def __init__(self, port: int, node: nodepki.NodePki) -> None:
        # Mutual TLS with a joined node's certificate: what a node that went bad (or was taken over) can
        # send, the worst a peer gets to; a stranger without one does not get past the handshake.
        ca, cert, key = node.credentials()
        # No send limit here: the point is what the server does with a message over its own.
        self.channel = grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca, key, cert),
                                           options=[("grpc.max_send_message_length", -1)])
        self._out: queue.Queue[bytes | None] = queue.Queue()
        connect = self.channel.stream_stream(CONNECT, request_serializer=lambda b: b,
                                             response_deserializer=lambda b: b)
        self.replies = connect(iter(self._out.get, None), timeout=30)

    def send(self, data: bytes) -> None:
        self._out.put(data)

    def register(self, node_id: str) -> pb.ControlMessage:
        register = pb.Register(node_id=node_id, protocol=skew.PROTOCOL)
        self.send(pb.AgentMessage(seq=1, register=register).SerializeToString())
        return pb.ControlMessage.FromString(next(self.replies))

    def end(self) -> tuple[list[pb.ControlMessage], grpc.StatusCode]:
        """Reads until the server ends the stream: what it sent, and the status it ended with."""
        got = []
        try:
            for raw in self.replies:
                got.append(pb.ControlMessage.FromString(raw))
        except grpc.RpcError as e:
            return got, e.code()
        return got, grpc.StatusCode.OK

    def close(self) -> None:
        self._out.put(None)
        self.channel.close()


@pytest.fixture
def raws(cluster: System, tmp_path: Path) -> Iterator[Callable[[str], _RawStream]]:
    """Opens raw streams as node ids of the test's choosing: each joined for real (node1: its own certificate)."""
    opened: list[_RawStream] = []

    def open_as(node_id: str) -> _RawStream:
        if node_id == "node1":
            node = nodepki.of(cluster.root / "node1")
            assert node is not None
        else:
            node = agent_join.join(server=f"127.0.0.1:{cluster.join_port}", token=cluster.join_token(),
                                   ca_hash=cluster.ca_hash, node_id=node_id, state_dir=tmp_path / node_id).pki
        opened.append(_RawStream(cluster.agent_port, node))
        return opened[-1]

    try:
        yield open_as
    finally:
        for stream in opened:
            stream.close()


def _node(s: System, node_id: str) -> dict[str, Any] | None:
    return next((n for n in s.get("/api/v1/nodes")["items"] if n["id"] == node_id), None)


# -- the agent stream ---------------------------------------------------------------------------

def test_engine_args_with_shell_metacharacters_reach_the_engine_as_literal_argv(cluster: System,
                                                                                  tmp_path: Path) -> None:
    """`; rm -rf DIR`, `$(touch F)`, backticks and `&&` reach the engine verbatim, as argv; no shell runs them."""
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep").write_text("kept")
    marker = f"/tmp/pwned-{uuid.uuid4().hex}"
    hostile = [f"; rm -rf {canary}", f"$(touch {marker})", f"`touch {marker}-bt`", f"x && touch {marker}-and"]
    # The sim engine refuses arguments it does not know (argparse) and every string option it has
    # is set by llmgw itself, so it exits at once, saying what it got: the words a shell would have
    # split at `;` and `&&` and replaced for `$(...)` and backticks.
    cluster.apply(sim_model("meta", args=["--decode-tps", "400", *hostile]))
    try:
        def refused() -> str | None:
            for log in (cluster.root / "node1").rglob("*.log"):
                text = log.read_text(errors="replace")
                if "unrecognized arguments" in text:
                    return text
            return None
        said = str(wait_for(refused, timeout=30, interval=0.2, what="the sim engine's refusal"))
        assert f"unrecognized arguments: {' '.join(hostile)}" in said, said[-2000:]
    finally:
        assert cluster.request("DELETE", "/api/v1/models/meta").status_code in (200, 202, 204)
    for path in (marker, f"{marker}-bt", f"{marker}-and"):
        assert not Path(path).exists(), f"{path} was created: a shell ran an engine argument"
    assert (canary / "keep").read_text() == "kept"
    _unharmed(cluster)


@pytest.mark.parametrize("first", [True, False], ids=["instead-of-register", "after-register"])
def test_bytes_that_are_no_message_end_only_that_stream(cluster: System, raws: Callable[[str], _RawStream],
                                                        first: bool) -> None:
    """Bytes that are not an AgentMessage end that stream with a logged reason; the server and node1 go on."""
    node_id = f"bad-garbage-{uuid.uuid4().hex[:6]}"
    raw = raws(node_id)
    if not first:
        assert raw.register(node_id).ack.ok
        wait_for(lambda: (_node(cluster, node_id) or {}).get("connected"), timeout=10, what=f"{node_id} connected")
    raw.send(b"\xff" * 16)  # a field tag whose varint never ends: no protobuf decoder reads it
    got, code = raw.end()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and not any(m.ack.ok for m in got[1:]), (got, code)
    if not first:
        wait_for(lambda: not (_node(cluster, node_id) or {}).get("connected"), timeout=10,
                 what=f"{node_id} disconnected")
    else:
        assert _node(cluster, node_id) is None
    log = _server_log(cluster)
    assert "not an AgentMessage" in log and "Traceback" not in log, log[-3000:]
    _unharmed(cluster)


@pytest.mark.parametrize("first", [True, False], ids=["instead-of-register", "after-register"])
def test_a_message_over_the_receive_limit_ends_only_that_stream(cluster: System, raws: Callable[[str], _RawStream],
                                                                first: bool) -> None:
    """A 5 MiB message (the server takes 4) is refused with RESOURCE_EXHAUSTED; the server and node1 go on."""
    node_id = f"bad-big-{uuid.uuid4().hex[:6]}"
    raw = raws(node_id)
    if not first:
        assert raw.register(node_id).ack.ok
    big = pb.AgentMessage(seq=2, register=pb.Register(node_id=node_id, hostname="x" * (5 << 20),
                                                      protocol=skew.PROTOCOL))
    raw.send(big.SerializeToString())
    got, code = raw.end()
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (got, code)
    if not first:
        wait_for(lambda: not (_node(cluster, node_id) or {}).get("connected"), timeout=10,
                 what=f"{node_id} disconnected")
    else:
        assert _node(cluster, node_id) is None
        assert "sent a message over 4 MiB" in _server_log(cluster), _server_log(cluster)[-3000:]
    assert len(json.dumps(cluster.get("/api/v1/nodes"))) < 100_000  # the 5 MiB hostname was stored nowhere
    _unharmed(cluster)


def test_a_register_for_a_connected_node_is_refused_not_a_takeover(cluster: System,
                                                                   raws: Callable[[str], _RawStream]) -> None:
    """A second stream with node1's own certificate (its key copied off the node) is refused with a reason naming
    the node and both peers; node1 keeps its stream."""
    raw = raws("node1")
    reply = raw.register("node1")
    assert not reply.ack.ok, reply
    assert "node1" in reply.ack.error and "already connected" in reply.ack.error, reply.ack.error
    got, code = raw.end()
    assert not any(m.HasField("start_shard") for m in got), got
    log = _server_log(cluster)
    assert "refused agent at" in log and "already connected" in log, log[-3000:]
    _unharmed(cluster)


# -- model files ---------------------------------------------------------------------------------

def _with(spec: dict[str, Any], name: str) -> dict[str, Any]:
    doc = sim_model(name)
    doc["spec"].update(spec)
    return doc


BAD_MODELS: dict[str, tuple[dict[str, Any], int, str]] = {
    # case: (spec fields, status, what the message names)
    "unknown field": ({"replicaz": 2}, 422, "spec.replicaz"),
    "wrong type": ({"replicas": "two"}, 422, "spec.replicas"),
    "negative count": ({"replicas": -1}, 422, "spec.replicas"),
    "engine_args not a list": ({"engine_args": "--x; rm -rf /"}, 422, "spec.engine_args"),
    "10 MB string": ({"served_name": "x" * (10 << 20)}, 413, "limit"),
}


@pytest.mark.parametrize("case", list(BAD_MODELS))
def test_rest_apply_of_a_bad_model_is_a_4xx_naming_it_and_stores_nothing(cluster: System, case: str) -> None:
    """POST /api/v1/models with a bad model: a 4xx in the OpenAI error shape naming the field; no model is stored."""
    spec, status, names = BAD_MODELS[case]
    name = f"bad-{uuid.uuid4().hex[:8]}"
    r = cluster.request("POST", "/api/v1/models", json=_with(spec, name))
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert names in err["message"] and err["type"] == "invalid_request_error", err
    if status == 422:
        assert err["param"] == names, err
    assert cluster.request("GET", f"/api/v1/models/{name}").status_code == 404
    assert name not in json.dumps(cluster.get("/api/v1/models"))
    _unharmed(cluster)


@pytest.mark.parametrize("body", [b"[" * 100_000, b'{"apiVersion": ' + b"[" * 100_000, b"[1, 2]", b'"a model"', b"7"],
                         ids=["nested-100k", "nested-in-object", "list", "string", "number"])
def test_rest_apply_of_a_body_that_is_no_model_is_a_400_or_422(cluster: System, body: bytes) -> None:
    """A body nested 100,000 deep, or not an object at all: a 4xx with a message, never a 500; nothing stored."""
    before = cluster.get("/api/v1/models")["items"]
    r = cluster.request("POST", "/api/v1/models", content=body, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text[:500]
    assert r.json()["error"]["message"], r.text[:500]
    assert cluster.get("/api/v1/models")["items"] == before
    _unharmed(cluster)


def test_llmgw_apply_of_bad_model_files_names_the_field_and_stores_nothing(cluster: System, tmp_path: Path) -> None:
    """`llmgw apply -f` on each bad file exits 1 naming the field (or the size limit); no model is stored."""
    names = []
    for i, (case, (spec, _status, says)) in enumerate(BAD_MODELS.items()):
        name = f"badcli-{i}-{uuid.uuid4().hex[:6]}"
        names.append(name)
        path = tmp_path / f"{i}.yaml"
        path.write_text(yaml.safe_dump(_with(spec, name), width=1 << 30))
        out = subprocess.run([*LLMGW, "apply", "-f", str(path), "--url", cluster.url], capture_output=True,
                             text=True, timeout=60, env=cluster.cli_env())
        said = " ".join((out.stdout + out.stderr).split())
        assert out.returncode == 1 and says in said and "Traceback" not in said, (case, said[-800:])
    stored = json.dumps(cluster.get("/api/v1/models"))
    assert not any(n in stored for n in names), stored[:500]
    _unharmed(cluster)


# -- the router ----------------------------------------------------------------------------------

ROUTER_BODIES = {
    "list": (b'[{"model": "m"}]', 400, "JSON object"),
    "string": (b'"hello"', 400, "JSON object"),
    "number": (b"42", 400, "JSON object"),
    "nested-100k": (b"[" * 100_000 + b"]" * 100_000, 400, "nested"),
    "nested-in-object": (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested"),
    "over-the-limit": (b'{"model": "m", "x": "' + b"x" * (33 << 20) + b'"}', 413, "limit"),
}


@pytest.mark.parametrize("case", list(ROUTER_BODIES))
def test_router_refuses_a_bad_body_in_openai_shape_and_serves_the_next(cluster: System, case: str) -> None:
    """Not an object, nested 100,000 deep, or over 32 MiB: a 400/413, OpenAI-shaped; the next request is served."""
    body, status, says = ROUTER_BODIES[case]
    if not any(m["metadata"]["name"] == "good" for m in cluster.get("/api/v1/models")["items"]):
        cluster.apply(sim_model("good"))
        cluster.wait_model("good")
        cluster.wait_router("good", 1)
    with httpx.Client(base_url=cluster.url, timeout=60, trust_env=False) as c:
        r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text[:500]
        err = r.json()["error"]
        assert says in err["message"].lower() or says in err["message"], err
        assert set(err) >= {"message", "type", "code"}, err
        ok = c.post("/v1/chat/completions", json={"model": "good", "messages": [{"role": "user", "content": "x"}],
                                                   "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["choices"], ok.text[:500]
    _unharmed(cluster)
