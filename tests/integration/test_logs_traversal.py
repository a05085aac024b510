"""A log request reads only shards' logs: traversals are refused at the REST route and by the agent itself."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.testing import fakecontrol
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW, System, sim_model

SECRET = "TOPSECRET-not-a-shard-log"

# As a client sends them: raw query strings, percent-encoding included.
RAW_TRAVERSALS = {
    "/var/log/dpkg": "%2Fvar%2Flog%2Fdpkg",
    "../../secret": "..%2F..%2Fsecret",
    "../../secret (literal slashes)": "../../secret",
    "../../../etc/passwd": "..%2F..%2F..%2Fetc%2Fpasswd",
    "..": "..",
    "a/../../b": "a%2F..%2F..%2Fb",
    "encoded dots": "%2e%2e%2f%2e%2e%2fsecret",
    "NUL": "a%00b",
    "leading dash": "-rf",
    "very long": "x" * 300,
}


def _plant_secrets(root: Path, node_id: str) -> Path:
    """A file a traversal from the node's run dir (<root>/<node>/shards) would reach, two levels up.

    The run dir is made here: the kernel resolves "shards/../.." only through a
    directory that exists, and on a node that has run anything it does.
    """
    secret = root / "secret.log"
    secret.write_text(f"{SECRET}\n")
    (root / node_id / "shards").mkdir(parents=True, exist_ok=True)
    return secret


@pytest.fixture
def node1(system: System) -> Iterator[tuple[System, Path]]:
    yield system, _plant_secrets(system.root, "node1")


def _auth(system: System) -> dict[str, str]:
    # httpx itself, not System.request: the raw query (`..`, `%2e%2e%2f`) must reach the server unnormalised.
    return {"Authorization": f"Bearer {system.token}"}


def test_rest_logs_route_refuses_a_traversal_with_400(node1: tuple[System, Path]) -> None:
    """`GET /api/v1/nodes/N/logs?shard=<traversal>` is a 400 that says what a shard id looks like, for each case."""
    system, secret = node1
    wrong = {}
    for case, query in [*RAW_TRAVERSALS.items(), ("absolute path to a real .log", str(secret.with_suffix("")))]:
        r = httpx.get(f"{system.url}/api/v1/nodes/node1/logs?shard={query}", timeout=30, trust_env=False,
                      headers=_auth(system))
        err = r.json().get("error") or {} if r.headers.get("content-type", "").startswith("application/json") else {}
        if not (r.status_code == 400 and SECRET not in r.text and err.get("code") == "invalid_shard_id"
                and err.get("param") == "shard" and "is not valid" in err.get("message", "")
                and "lower-case letters, digits" in err.get("message", "")):
            wrong[case] = f"{r.status_code} {r.text[:200]}"
    assert wrong == {}, wrong


def test_rest_logs_route_refuses_an_unknown_shard_naming_those_here(node1: tuple[System, Path]) -> None:
    """A well-formed id the node never ran is refused by the agent, listing the shards it has; a real one reads."""
    system, _ = node1
    system.apply(sim_model("talky"))
    system.wait_model("talky")
    shard = system.replicas("talky")[0]["shard"]
    r = httpx.get(f"{system.url}/api/v1/nodes/node1/logs", params={"shard": "nosuch-abc123-1"}, timeout=30,
                  trust_env=False, headers=_auth(system))
    assert r.status_code == 404, r.text
    message = r.json()["error"]["message"]
    assert message.startswith(f"no shard nosuch-abc123-1 on node node1; shards here: {shard}."), message
    ok = httpx.get(f"{system.url}/api/v1/nodes/node1/logs", params={"shard": shard, "lines": 5}, timeout=30,
                   trust_env=False, headers=_auth(system))
    assert ok.status_code == 200 and '"lines"' in ok.text, ok.text[:300]


class _Asker(agent_pb2_grpc.AgentServiceServicer):
    """A control plane that accepts the agent, sends it LogsRequests as they are, and keeps the replies.

    The real control plane refuses a bad id before it is sent; this one does
    not, so what is checked is the agent's own refusal.
    """

    def __init__(self, shard_ids: list[str]) -> None:
        self.shard_ids = shard_ids
        self.replies: dict[str, list[pb.LogsReply]] = {}
        self.done = threading.Event()

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ControlMessage]:
        first = await anext(request_iterator)
        yield pb.ControlMessage(seq=1, ack=pb.Ack(seq=first.seq, ok=True, protocol=skew.PROTOCOL))
        for i, shard_id in enumerate(self.shard_ids):
            yield pb.ControlMessage(seq=2 + i, logs_request=pb.LogsRequest(request_id=str(i), shard_id=shard_id,
                                                                           lines=10))
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "logs_reply":
                self.replies.setdefault(msg.logs_reply.request_id, []).append(msg.logs_reply)
                if sum(1 for rs in self.replies.values() if rs[-1].done) == len(self.shard_ids):
                    self.done.set()


def test_the_agent_itself_answers_a_traversal_with_an_error(tmp_path: Path) -> None:
    """Sent straight to a real agent, each bad id gets LogsReply.error, never a line of the file it names."""
    secret = _plant_secrets(tmp_path, "n1")
    run_dir = tmp_path / "n1" / "shards"
    (run_dir / "m-abc123-1.log").write_text("an engine's last words\n")  # a shard that ended before this agent
    bad = ["/var/log/dpkg", "../../secret", str(secret.with_suffix("")), "../../../etc/passwd", "..",
           "a/../../b", "a\0b", "-rf", "x" * 300, "%2e%2e%2fsecret"]
    asker = _Asker([*bad, "nosuch-abc123-1", "m-abc123-1"])
    port = free_port()
    ready, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=fakecontrol.serve, args=(asker, port, ready, stop), daemon=True)
    server.start()
    agent = None
    try:
        assert ready.wait(10)
        agent = Proc.start([*LLMGW, "agent", "--insecure", "--server", f"127.0.0.1:{port}",
                            "--node-id", "n1", "--state-dir", str(tmp_path / "n1"), "--heartbeat-interval", "1"],
                           log_path=tmp_path / "agent.log")
        wait_for(asker.done.is_set, timeout=30, what="a reply to every logs request")
    finally:
        if agent is not None:
            agent.stop(timeout=15)
        stop.set()
        server.join(10)
    for i, shard_id in enumerate(bad):
        (reply,) = asker.replies[str(i)]
        assert reply.done and not reply.lines, (shard_id, reply)
        assert "is not valid" in reply.error and "lower-case letters, digits" in reply.error, (shard_id, reply.error)
    (unknown,) = asker.replies[str(len(bad))]
    assert unknown.error.startswith("no shard nosuch-abc123-1 on node n1; shards here: m-abc123-1."), unknown
    got = asker.replies[str(len(bad) + 1)]
    assert [line for r in got for line in r.lines] == ["an engine's last words"] and not got[-1].error
    assert SECRET not in (tmp_path / "agent.log").read_text()
