"""Joining and the mutual-TLS agent stream, on real processes and real TLS over loopback (issue 13).

A small harness of its own (a secure server on free ports, agents joined with tokens made straight in
the store) so these tests say exactly what they start; a raw gRPC client plays the impostors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.control import datadir, tokens
from llmgw.control.store import store as store_mod
from llmgw.core import pki, skew
from llmgw.testing.procs import Proc, free_port, wait_for

LLMGW = [sys.executable, "-m", "llmgw"]


class Cluster:
    """One secure `llmgw server` under ``root`` (initialised here), its agents, and a REST client."""

    def __init__(self, root: Path, *, server_args: tuple[str, ...] = ()) -> None:
        self.root, self.data = root, root / "data"
        self.server_args = server_args
        done = datadir.init(self.data, hosts=[])
        self.password = done.admin_password
        self.ca_hash = done.ca_hash
        self.http_port, self.agent_port, self.join_port = free_port(), free_port(), free_port()
        self.server: Proc | None = None
        self.agents: dict[str, Proc] = {}
        self.headers: dict[str, str] = {}

    def start_server(self) -> None:
        ports = self.root / "ports.json"
        ports.unlink(missing_ok=True)
        self.server = Proc.start([*LLMGW, "server", "--data-dir", str(self.data), "--http-port", str(self.http_port),
                                  "--agent-port", str(self.agent_port), "--join-port", str(self.join_port),
                                  "--ports-file", str(ports), *self.server_args],
                                 log_path=self.root / "server.log")
        wait_for(lambda: ports.exists() and ports.read_text(), timeout=30, what="server ports file")
        self.server.wait_http(f"{self.url}/healthz", timeout=30)
        if not self.headers:
            got = httpx.post(f"{self.url}/api/v1/login", json={"username": "admin", "password": self.password})
            assert got.status_code == 200, got.text
            self.headers = {"Authorization": f"Bearer {got.json()['token']}"}

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop(timeout=10)
            self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def get(self, path: str) -> Any:
        resp = httpx.get(self.url + path, headers=self.headers, timeout=10)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def post(self, path: str) -> httpx.Response:
        return httpx.post(self.url + path, headers=self.headers, timeout=10)

    def token(self, *, node: str = "", uses: int = 1) -> str:
        store = store_mod.Store.open(self.data)
        try:
            token_id, secret = tokens.create_token(store, ttl_s=600, uses=uses, node_name=node)
        finally:
            store.close()
        return f"{token_id}.{secret}"

    def join_argv(self, node_id: str, *, token: str = "", ca_hash: str = "", state: Path | None = None) -> list[str]:
        return [*LLMGW, "agent", "join", "--server", f"127.0.0.1:{self.join_port}", "--token", token or self.token(),
                "--ca-hash", ca_hash or self.ca_hash, "--node-id", node_id, "--state-dir",
                str(state or self.root / node_id), "--heartbeat-interval", "0.5"]

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> Proc:
        proc = Proc.start(argv, log_path=self.root / f"agent-{name}.log", env={**os.environ, **(env or {})})
        self.agents[name] = proc
        return proc

    def connected(self, node_id: str) -> bool:
        return any(n["id"] == node_id and n["connected"] for n in self.get("/api/v1/nodes")["items"])

    def close(self) -> None:
        for proc in self.agents.values():
            proc.stop(timeout=10)
        self.stop_server()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        c.start_server()
        yield c
    finally:
        c.close()


def _run(argv: list[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command that is expected to end by itself (a refusal, or --join-only)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _register(node_id: str) -> pb.AgentMessage:
    return pb.AgentMessage(seq=1, register=pb.Register(node_id=node_id, hostname=node_id, protocol=skew.PROTOCOL))


def _connect(port: int, creds: grpc.ChannelCredentials, node_id: str) -> pb.ControlMessage:
    """One Connect with a bare Register; the server's first answer (or the RpcError it ended in)."""
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(iter([_register(node_id)]), timeout=10)
        first: pb.ControlMessage = next(iter(call))
        call.cancel()
        return first


def _creds(state: Path) -> grpc.ChannelCredentials:
    d = state / "pki"
    return grpc.ssl_channel_credentials(root_certificates=(d / "ca.crt").read_bytes(),
                                        private_key=(d / "node.key").read_bytes(),
                                        certificate_chain=(d / "node.crt").read_bytes())


def _audit(c: Cluster) -> list[dict[str, Any]]:
    return [e for e in c.get("/api/v1/audit")["items"] if e["action"] == "node join"]


def test_join_with_a_fresh_token_works_and_its_files_are_owner_only(cluster: Cluster) -> None:
    """A fresh token joins n1: it registers over mutual TLS, and key and certificate are 0600 in a 0700 pki/."""
    cluster.start("n1", cluster.join_argv("n1"))
    wait_for(lambda: cluster.connected("n1"), timeout=30, what="n1 connected")
    pki_dir = cluster.root / "n1" / "pki"
    assert oct(pki_dir.stat().st_mode & 0o777) == "0o700"
    for name in ("node.key", "node.crt", "ca.crt", "join.json"):
        assert oct((pki_dir / name).stat().st_mode & 0o777) == "0o600", name
    assert pki.common_name((pki_dir / "node.crt").read_bytes()) == "n1"
    assert json.loads((pki_dir / "join.json").read_text())["servers"] == [f"127.0.0.1:{cluster.agent_port}"]
    certs = cluster.get("/api/v1/nodes/n1/certificates")["items"]
    assert len(certs) == 1 and certs[0]["revoked_at"] is None
    assert [e["outcome"] for e in _audit(cluster)] == ["ok"]


def test_the_same_token_again_and_a_second_certificate_for_a_node_are_refused(cluster: Cluster) -> None:
    """A used token is refused (audited with the peer); a node id holding a certificate needs a token naming it."""
    token = cluster.token()
    first = _run([*cluster.join_argv("n1", token=token), "--join-only"])
    assert first.returncode == 0, first.stderr
    again = _run([*cluster.join_argv("n2", token=token), "--join-only"])
    assert again.returncode == 1
    assert "has been used as often as it may" in again.stderr, again.stderr
    assert not (cluster.root / "n2" / "pki").exists()
    refused = [e for e in _audit(cluster) if e["outcome"] == "refused"]
    assert refused and refused[0]["actor"].startswith("join@ipv4:127.0.0.1:"), refused

    # n1 again from another state directory: it already holds a certificate.
    other = cluster.root / "n1-bis"
    taken = _run([*cluster.join_argv("n1", state=other), "--join-only"])
    assert taken.returncode == 1
    assert "node n1 already has a certificate" in taken.stderr and "llmgw node revoke n1" in taken.stderr
    # A token made for n1 replaces it.
    named = _run([*cluster.join_argv("n1", token=cluster.token(node="n1"), state=other), "--join-only"])
    assert named.returncode == 0, named.stderr
    # And the first state directory refuses a second join.
    twice = _run([*cluster.join_argv("n1"), "--join-only"])
    assert twice.returncode == 1 and "already joined as node n1" in twice.stderr, twice.stderr


def test_a_join_command_with_another_ca_hash_sends_nothing(cluster: Cluster) -> None:
    """A CA hash that is not the server's CA's stops the join before the token is sent: the token stays unused."""
    token = cluster.token()
    wrong = pki.ca_hash(pki.create_ca().cert_pem)
    got = _run([*cluster.join_argv("n1", token=token, ca_hash=wrong), "--join-only"])
    assert got.returncode == 1 and "not the cluster the join command came from" in got.stderr, got.stderr
    assert _audit(cluster) == []  # the server never saw a Join
    assert _run([*cluster.join_argv("n1", token=token), "--join-only"]).returncode == 0  # the token still works


def test_impostors_are_refused(cluster: Cluster) -> None:
    """No certificate, another CA's, node A's claiming B, and a stream on the join port are each refused."""
    assert _run([*cluster.join_argv("a"), "--join-only"]).returncode == 0
    assert _run([*cluster.join_argv("b"), "--join-only"]).returncode == 0
    ca_pem = (cluster.root / "a" / "pki" / "ca.crt").read_bytes()

    # No certificate: the agent port's handshake refuses it.
    with pytest.raises(grpc.RpcError) as bare:
        _connect(cluster.agent_port, grpc.ssl_channel_credentials(root_certificates=ca_pem), "a")
    assert bare.value.code() is grpc.StatusCode.UNAVAILABLE

    # A certificate for "a" signed by another CA.
    other = pki.create_ca()
    key = pki.new_key()
    forged = pki.sign_csr(other, pki.create_csr("a", key), "a")
    with pytest.raises(grpc.RpcError) as foreign:
        _connect(cluster.agent_port, grpc.ssl_channel_credentials(
            root_certificates=ca_pem, private_key=pki.key_pem(key), certificate_chain=forged), "a")
    assert foreign.value.code() is grpc.StatusCode.UNAVAILABLE

    # a's own certificate, registering as b.
    claim = _connect(cluster.agent_port, _creds(cluster.root / "a"), "b")
    assert claim.WhichOneof("body") == "ack" and not claim.ack.ok
    assert "node 'a'" in claim.ack.error and "node 'b'" in claim.ack.error, claim.ack.error

    # The join port serves no stream.
    on_join = _connect(cluster.join_port, grpc.ssl_channel_credentials(root_certificates=ca_pem), "a")
    assert not on_join.ack.ok and f"agent stream is on port {cluster.agent_port}" in on_join.ack.error

    # With its own certificate, a gets in: the refusals above were about identity, not the harness.
    ok = _connect(cluster.agent_port, _creds(cluster.root / "a"), "a")
    assert ok.ack.ok, ok.ack.error

    # The agent itself refuses a --node-id other than its certificate's, before dialling.
    named = _run([*LLMGW, "agent", "--state-dir", str(cluster.root / "a"), "--node-id", "b"])
    assert named.returncode == 1 and "joined as 'a'" in named.stderr and "'b'" in named.stderr, named.stderr


def test_a_revoked_node_is_cut_off_within_a_second(cluster: Cluster) -> None:
    """`node revoke` closes the stream at once, and the node's certificate is refused from then on."""
    cluster.start("n1", cluster.join_argv("n1"))
    wait_for(lambda: cluster.connected("n1"), timeout=30, what="n1 connected")
    t0 = time.monotonic()
    resp = cluster.post("/api/v1/nodes/n1/revoke")
    assert resp.status_code == 200 and resp.json()["revoked"] == 1, resp.text
    wait_for(lambda: not cluster.connected("n1"), timeout=5, interval=0.01, what="n1 cut off")
    cut_off = time.monotonic() - t0
    print(f"revoked node cut off {cut_off * 1000:.0f} ms after the revoke request was sent")
    assert cut_off < 1.0
    refused = wait_for(lambda: "was revoked at" in cluster.agents["n1"].log_tail(50), timeout=10,
                       what="the agent told of its revocation")
    assert refused
    time.sleep(1.5)  # it keeps redialling; none of it gets in
    assert not cluster.connected("n1")
    again = _connect(cluster.agent_port, _creds(cluster.root / "n1"), "n1")
    assert not again.ack.ok and "was revoked at" in again.ack.error
    assert [c["revoked_at"] is not None for c in cluster.get("/api/v1/nodes/n1/certificates")["items"]] == [True]
    assert any(e["action"] == "revoke" and e["object"] == "node/n1" for e in cluster.get("/api/v1/audit")["items"])
    # The CLI's view of the same: the certificate listed as revoked; revoking again finds nothing left to revoke.
    env = {**os.environ, "LLMGW_TOKEN": cluster.headers["Authorization"].removeprefix("Bearer ")}
    listed = subprocess.run([*LLMGW, "node", "certificates", "n1", "--url", cluster.url], capture_output=True,
                            text=True, timeout=60, env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].rstrip().endswith("UTC")  # its REVOKED column has a time, not "-"
    again_cli = subprocess.run([*LLMGW, "node", "revoke", "n1", "--url", cluster.url], capture_output=True,
                               text=True, timeout=60, env=env)
    assert again_cli.returncode == 0 and "node/n1 revoked (0 certificate(s))" in again_cli.stdout, again_cli
    unknown = subprocess.run([*LLMGW, "node", "revoke", "nobody", "--url", cluster.url], capture_output=True,
                             text=True, timeout=60, env=env)
    assert unknown.returncode == 1 and "has no certificate from this control plane" in unknown.stderr, unknown


def test_renewal_happens_on_the_stream_and_the_renewed_certificate_reconnects(tmp_path: Path) -> None:
    """With 24 s certificates the agent renews over its stream without reconnecting; after the first
    certificate expired, a restarted server takes the agent back with the renewed one."""
    # 24 s: renewed at 16 s, the renewed one lasts until 40 s, so a server down from 24.5 s (a slow restart
    # on a loaded machine) still has it back in time; a 1 s reconnect cap keeps the agent's backoff from
    # sleeping past that (with 20 s and the default 30 s cap, one run on a busy machine came back too late).
    c = Cluster(tmp_path, server_args=("--node-cert-validity", "24s"))
    try:
        c.start_server()
        c.start("n1", c.join_argv("n1"), env={"LLMGW_AGENT_RECONNECT_MAX": "1"})
        wait_for(lambda: c.connected("n1"), timeout=30, what="n1 connected")
        cert = tmp_path / "n1" / "pki" / "node.crt"
        first = cert.read_bytes()
        expires = pki.load_cert(first).not_valid_after_utc.timestamp()
        wait_for(lambda: cert.read_bytes() != first, timeout=30, interval=0.2, what="a renewed certificate")
        renewed = cert.read_bytes()
        print(f"renewed {expires - time.time():.1f} s before the first 24 s certificate's end, on the same stream")
        assert pki.common_name(renewed) == "n1"
        assert oct(cert.stat().st_mode & 0o777) == "0o600"
        log = c.agents["n1"].log_tail(200)
        assert log.count("registered with") == 1, log  # renewed on the stream it had: no reconnect
        assert len(c.get("/api/v1/nodes/n1/certificates")["items"]) >= 2
        # Past the first certificate's end, with the server restarted, only the renewed one can get in.
        time.sleep(max(0.0, expires - time.time() + 0.5))
        c.stop_server()
        c.start_server()
        t_up = time.monotonic()
        wait_for(lambda: c.connected("n1"), timeout=30, what="n1 back with its renewed certificate")
        print(f"back {time.monotonic() - t_up:.2f} s after the restarted server answered, with the renewed certificate")
        assert c.agents["n1"].poll() is None
    finally:
        c.close()


def test_an_agent_and_a_server_of_different_modes_refuse_to_start(cluster: Cluster, tmp_path: Path) -> None:
    """--insecure against a TLS server, certificates against an --insecure one, and no certificate at all
    each stop the agent at start with the reason."""
    plain = _run([*LLMGW, "agent", "--insecure", "--server", f"127.0.0.1:{cluster.agent_port}", "--state-dir",
                  str(tmp_path / "plain")])
    assert plain.returncode == 1 and "speaks TLS" in plain.stderr, plain.stderr

    unjoined = _run([*LLMGW, "agent", "--server", f"127.0.0.1:{cluster.agent_port}", "--state-dir",
                     str(tmp_path / "fresh")])
    assert unjoined.returncode == 1 and "has not joined" in unjoined.stderr, unjoined.stderr

    assert _run([*cluster.join_argv("n1"), "--join-only"]).returncode == 0
    insecure_port, insecure_http = free_port(), free_port()
    server = Proc.start([*LLMGW, "server", "--insecure", "--data-dir", str(tmp_path / "insecure"), "--http-port",
                         str(insecure_http), "--agent-port", str(insecure_port)], log_path=tmp_path / "insecure.log")
    try:
        server.wait_http(f"http://127.0.0.1:{insecure_http}/healthz", timeout=30)
        mtls = _run([*LLMGW, "agent", "--server", f"127.0.0.1:{insecure_port}", "--state-dir",
                     str(cluster.root / "n1")])
        assert mtls.returncode == 1 and "speaks plaintext" in mtls.stderr, mtls.stderr
        # A join pointed at it finds no TLS to check the CA in, and says so before sending the token.
        joining = _run([*LLMGW, "agent", "join", "--server", f"127.0.0.1:{insecure_port}", "--token",
                        cluster.token(), "--ca-hash", cluster.ca_hash, "--state-dir", str(tmp_path / "j")])
        assert joining.returncode == 1 and "did not answer TLS" in joining.stderr, joining.stderr
    finally:
        server.stop(timeout=10)


def test_an_insecure_agent_refuses_a_server_off_loopback(tmp_path: Path) -> None:
    """--insecure names only loopback servers: another address is refused before anything is dialled."""
    got = _run([*LLMGW, "agent", "--insecure", "--server", "192.0.2.1:8081", "--state-dir", str(tmp_path)])
    assert got.returncode == 1 and "loopback development only" in got.stderr, got.stderr
