"""A node joined again (``llmgw token create --node N``) shuts its old certificate out, over real mutual TLS.

Found by an attacker's probe: the rejoin left the old certificate valid for a year, and the old agent kept
connecting. The join now revokes the node's earlier certificates and closes the stream opened with one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc

from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System


def _creds(state: Path) -> grpc.ChannelCredentials:
    d = state / "pki"
    return grpc.ssl_channel_credentials(root_certificates=(d / "ca.crt").read_bytes(),
                                        private_key=(d / "node.key").read_bytes(),
                                        certificate_chain=(d / "node.crt").read_bytes())


def _connect(port: int, state: Path, node_id: str) -> pb.ControlMessage:
    """One Connect with the certificate in ``state`` and a bare Register; the server's first answer."""
    with grpc.secure_channel(f"127.0.0.1:{port}", _creds(state)) as channel:
        register = pb.Register(node_id=node_id, hostname=node_id, protocol=skew.PROTOCOL)
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(
            iter([pb.AgentMessage(seq=1, register=register)]), timeout=10)
        first: pb.ControlMessage = next(iter(call))
        call.cancel()
        return first


def test_a_rejoin_revokes_the_old_certificate_and_cuts_its_stream(tmp_path: Path) -> None:
    """n1 runs; n1 joins again from another state directory with a token for n1: the old agent's stream is
    closed and its certificate refused at Connect, the new one gets in, and the store lists the old revoked."""
    s = System(tmp_path)
    try:
        s.start_server()
        s.start_agent("n1")
        old_state, new_state = tmp_path / "n1", tmp_path / "n1-new"
        rejoin = subprocess.run([*LLMGW, "agent", "join", *s.join_args("n1", token=s.join_token(node="n1")),
                                 "--node-id", "n1", "--state-dir", str(new_state), "--join-only"],
                                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert rejoin.returncode == 0, rejoin.stderr
        # The old agent's stream is closed, and its redials are refused for its revoked certificate.
        wait_for(lambda: "was revoked at" in s.agents["n1"].log_tail(80), timeout=20,
                 what="the old agent told its certificate was revoked")
        refused = _connect(s.agent_port, old_state, "n1")
        assert not refused.ack.ok and "was revoked at" in refused.ack.error, refused
        s.stop_agent("n1")
        # The new certificate gets in.
        admitted = _connect(s.agent_port, new_state, "n1")
        assert admitted.ack.ok, admitted.ack.error
        certs = s.get("/api/v1/nodes/n1/certificates")["items"]
        assert [c["revoked_at"] is not None for c in certs] == [True, False], certs
        joins = [e for e in s.get("/api/v1/audit")["items"] if e["action"] == "node join"]
        assert "1 earlier certificate(s) of the node revoked" in joins[-1]["detail"], joins
    finally:
        s.close()
