"""Weights across a cluster of real processes on 127.0.0.1: the mirror mounted in the server (`--mirror-dir`),
one upstream fetch per file for 4 nodes pulling through it, and an agent killed mid-download that resumes.

The "hub" is a second ``llmgw mirror`` process holding a fake repository (``llmgw.testing.hfrepo``), or a
throttling HTTP server (``llmgw.testing.flakyhttp``); nothing reaches the internet. The huggingface_hub client
runs in a child process with no token, an empty HF_HOME and a dead proxy for everything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.testing import fakecontrol, hfrepo, procs
from llmgw.testing.flakyhttp import FlakyHttp
from llmgw.testing.system import LLMGW, System, sim_model

pytestmark = pytest.mark.slow
REPO = "org/model"

HF_CLIENT = r"""
import json, sys
import huggingface_hub as h
endpoint, out = sys.argv[1], sys.argv[2]
got = {f: h.hf_hub_download("org/model", f, endpoint=endpoint, token=False, cache_dir=out)
       for f in ("config.json", "model-00001-of-00002.safetensors")}
print(json.dumps(got))
"""


@contextlib.contextmanager
def system(root: Path, server_args: list[str], *, agent_env: dict[str, str] | None = None) -> Iterator[System]:
    """A server with ``server_args`` and no agent yet, everything stopped (by pid) whatever happens."""
    s = System(root, server_args=server_args, agent_env=agent_env)
    try:
        s.start_server()
        yield s
    finally:
        s.close()


@contextlib.contextmanager
def upstream_mirror(tmp: Path, root: Path) -> Iterator[str]:
    """A ``llmgw mirror`` process serving ``root``, the stand-in for the hub; yields its URL."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with procs.Proc.start(argv, log_path=tmp / "upstream-mirror.log") as proc:
        proc.wait_http(url + "/healthz", timeout=30)
        yield url


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_hf_hub_download_from_the_mirror_mounted_in_the_server(tmp_path: Path) -> None:
    """`llmgw server --mirror-dir` serves the directory at /mirror to huggingface_hub itself, byte for byte."""
    files = hfrepo.sample_files(seed=5)
    sha = hfrepo.write_repo(tmp_path / "weights", REPO, files)
    with system(tmp_path / "sys", ["--mirror-dir", str(tmp_path / "weights")]) as s:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
        env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
                   HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")
        done = subprocess.run([sys.executable, "-c", HF_CLIENT, f"{s.url}/mirror", str(tmp_path / "hf-out")], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        for name, path in got.items():
            assert Path(path).read_bytes() == files[name]
            assert f"/snapshots/{sha}/" in path
        # The server's own routes are untouched by the mount.
        assert s.get("/api/v1/models")["items"] == []
        head = s.request("HEAD", "/mirror/org/model/resolve/main/config.json")
        assert head.status_code == 200 and head.headers["x-repo-commit"] == sha
        # The admin API is off without LLMGW_MIRROR_ADMIN_TOKEN, and says how to turn it on.
        refused = s.request("POST", "/mirror/admin/add", json={"source": f"hf://{REPO}"})
        assert refused.status_code == 403 and "LLMGW_MIRROR_ADMIN_TOKEN" in refused.text


def test_four_nodes_through_the_servers_mirror_fetch_each_file_once_upstream(tmp_path: Path) -> None:
    """4 replicas spread on 4 nodes through the server's pull-through mirror: 1 upstream fetch per file, all Ready."""
    files = hfrepo.sample_files(seed=6, shard_bytes=4 << 20)
    hfrepo.write_repo(tmp_path / "hub", REPO, files)
    size = sum(len(data) for data in files.values())
    with upstream_mirror(tmp_path, tmp_path / "hub") as hub, \
            system(tmp_path / "sys", ["--mirror-dir", str(tmp_path / "edge"), "--mirror-upstream", hub]) as s:
        nodes = [f"node{i}" for i in range(1, 5)]
        for node in nodes:
            s.start_agent(node)
        # One flag: with no --hub-endpoint, hf:// sources come from the server's own /mirror.
        s.apply(sim_model("spread", replicas=4, source=f"hf://{REPO}", placement="spread"))
        s.wait_model("spread", timeout=60)
        assert sorted(r["node"] for r in s.replicas("spread")) == nodes

        # What the server's mirror fetched from outside the cluster (the hub), counted per file.
        # An admin's: the system's admin token is sent (a request without one is refused, test_mirror_admin).
        edge = s.get("/mirror/admin/stats")["upstream"]
        assert edge["url"] == hub
        assert sorted(k.split("/", 2)[2] for k in edge["files"]) == sorted(files)
        assert set(edge["files"].values()) == {1}, edge["files"]

        def listed() -> list[dict[str, Any]] | None:
            rows = [w for w in s.get("/api/v1/weights")["items"] if w["source"] == f"hf://{REPO}"]
            return rows if sorted(w["node"] for w in rows) == nodes else None

        rows = procs.wait_for(listed, timeout=30, interval=0.3, what="the weights in every node's inventory")
        assert all(w["fetched_by_llmgw"] for w in rows)
        assert {w["size_bytes"] for w in rows} == {size}
        assert len({w["cache_name"] for w in rows}) == 1


def test_agent_killed_mid_download_resumes_with_range(tmp_path: Path) -> None:
    """An agent SIGKILLed mid-download, restarted on the same dirs, resumes with Range; sha256 matches; Ready."""
    served = tmp_path / "served"
    served.mkdir()
    data = os.urandom(16 << 20)
    (served / "big.gguf").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    # 16 MiB at 800 kB/s: about 20 s if nothing changed; the test kills the agent a few MiB in.
    with FlakyHttp(served, rate_bps=800_000) as srv, \
            system(tmp_path / "sys", ["--fetch-allow-private", srv.allowed],
                   agent_env={"LLMGW_AGENT_FETCH_ALLOW_PRIVATE": srv.allowed}) as s:
        s.start_agent("node1")
        s.apply(sim_model("resumed", source=f"{srv.url}/big.gguf", source_sha256=digest))
        partial = tmp_path / "sys" / "node1" / "weights" / ".partial"

        def partial_bytes() -> int:
            return sum(p.stat().st_size for p in partial.rglob("*") if p.is_file() and p.name != "sidecar.json")

        procs.wait_for(lambda: partial_bytes() >= 2 << 20, timeout=30, interval=0.1, what="2 MiB of the download")
        s.kill_agent("node1")
        kept = partial_bytes()
        assert 0 < kept < len(data)
        srv.rate_bps = None
        s.start_agent("node1")
        s.wait_model("resumed", timeout=60)
        resumed = [r for r in srv.ranges("/big.gguf") if r]
        assert resumed, srv.ranges("/big.gguf")
        # Where it stopped: the restarted agent asks for exactly the bytes past those it kept.
        starts = [int(r.removeprefix("bytes=").split("-")[0]) for r in resumed]
        assert starts[-1] == kept > 0, (starts, kept)
        held = procs.wait_for(lambda: next((w for w in s.get("/api/v1/weights")["items"]
                                            if w["source"] == f"{srv.url}/big.gguf"), None),
                              timeout=30, interval=0.3, what="the fetched file in node1's inventory")
        assert held["fetched_by_llmgw"] and held["size_bytes"] == len(data)
        assert hashlib.sha256(Path(held["path"]).read_bytes()).hexdigest() == digest


class _Remover(agent_pb2_grpc.AgentServiceServicer):
    """A control plane that accepts the agent and asks it to remove the names given, as they are; keeps the Acks.

    The real control plane asks only for what a node lists as fetched by llmgw; this one does not, so what is
    checked is the agent's own refusal, through the stream, with its real fetcher behind it.
    """

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.acks: dict[int, pb.Ack] = {}
        self.done = threading.Event()

    async def Connect(self, request_iterator: AsyncIterator[pb.AgentMessage],  # noqa: N802 - gRPC's name
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ControlMessage]:
        first = await anext(request_iterator)
        yield pb.ControlMessage(seq=1, ack=pb.Ack(seq=first.seq, ok=True, protocol=skew.PROTOCOL))
        for i, name in enumerate(self.names):
            yield pb.ControlMessage(seq=100 + i, remove_weights=pb.RemoveWeights(cache_name=name))
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "ack" and msg.ack.seq >= 100:
                self.acks[msg.ack.seq] = msg.ack
                if len(self.acks) == len(self.names):
                    self.done.set()


def test_remove_weights_through_the_stream_removes_only_what_llmgw_fetched(tmp_path: Path) -> None:
    """A real agent asked over gRPC to remove `../x`, a path, a hand-copied dir, a symlink out: refused, intact."""
    state = tmp_path / "n1"
    cache = state / "weights"
    cache.mkdir(parents=True)
    outside = state / "x"
    outside.write_text("not weights")
    (cache / "copied-by-hand").mkdir()
    (cache / "copied-by-hand" / "model.gguf").write_bytes(b"a person's file")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.gguf").write_bytes(b"someone else's file")
    (cache / "linked-out").symlink_to(elsewhere)
    (cache / "fetched-ok").mkdir()
    (cache / "fetched-ok" / "model.gguf").write_bytes(b"fetched")
    # What an earlier agent recorded: both names as fetched by llmgw (one since replaced by a symlink).
    record = {"source": "http://127.0.0.1:9/model.gguf", "rel": "model.gguf", "size_bytes": 7, "fetched_at": 1.0,
              "last_used_at": 1.0}
    (cache / ".llmgw-fetched.json").write_text(json.dumps(
        {"version": 1, "entries": {"linked-out": record, "fetched-ok": record}}))
    names = ["../x", str(outside), "copied-by-hand", "linked-out", "fetched-ok"]
    remover = _Remover(names)
    port = procs.free_port()
    ready, stop = threading.Event(), threading.Event()
    server = threading.Thread(target=fakecontrol.serve, args=(remover, port, ready, stop), daemon=True)
    server.start()
    agent = None
    try:
        assert ready.wait(10)
        agent = procs.Proc.start([*LLMGW, "agent", "--insecure", "--server", f"127.0.0.1:{port}",
                                  "--node-id", "n1", "--state-dir", str(state), "--heartbeat-interval", "1"],
                           log_path=tmp_path / "agent.log")
        procs.wait_for(remover.done.is_set, timeout=30, what="an Ack for every RemoveWeights")
    finally:
        if agent is not None:
            agent.stop(timeout=15)
        stop.set()
        server.join(10)
    acks = {name: remover.acks[100 + i] for i, name in enumerate(names)}
    assert acks["fetched-ok"].ok and not (cache / "fetched-ok").exists()
    expect = {"../x": "is a path, not a name", str(outside): "is a path, not a name",
              "copied-by-hand": "is not recorded", "linked-out": "is a symlink"}
    for name, says in expect.items():
        assert not acks[name].ok and says in acks[name].error, (name, acks[name].error)
    assert outside.read_text() == "not weights"
    assert (cache / "copied-by-hand" / "model.gguf").read_bytes() == b"a person's file"
    assert (cache / "linked-out").is_symlink() and (elsewhere / "model.gguf").read_bytes() == b"someone else's file"
    log = (tmp_path / "agent.log").read_text()
    assert all(f"refused to remove weights {name!r}" in log for name in expect), log[-3000:]
