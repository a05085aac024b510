"""``llmgw agent join``: a token and the CA's hash in, this node's key and certificate out, kubeadm-style.

The order is the point. (1) A TLS handshake that verifies nothing reads the server's chain, and the CA
in it is checked against ``--ca-hash`` before a single byte of ours is sent: a server that is not the
cluster's (a typo, someone in between) never sees the token. (2) The key is made here and stays here;
only a CSR leaves. (3) ``Join`` goes over a channel that trusts that CA alone, never the system's trust
store. (4) ``nodepki.write`` stores it all 0600. From then on the agent dials the agent port with
mutual TLS.

``probe`` is the other use of a bare handshake: at start, an agent with certificates and a plaintext
server (or ``--insecure`` and a TLS server) refuse each other with errors that name neither cause;
the probe finds out first and says which side is which.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import socket
import ssl
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from llmgw.agent import nodepki
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)
TIMEOUT_S = 10.0
_DER = 2  # _ssl.ENCODING_DER: what get_unverified_chain's certificates give with public_bytes


class JoinError(LlmgwError):
    """The join failed; the message says why and what to do."""


def split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _handshake(addr: str, *, timeout: float) -> ssl.SSLSocket:
    """A TLS connection that verifies nothing (the caller checks what it got); the caller closes it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only to read the chain: nothing is sent over this connection
    ctx.set_alpn_protocols(["h2"])  # gRPC's servers refuse a handshake without it
    host, port = split(addr)
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        return ctx.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise


def server_chain(addr: str, *, timeout: float = TIMEOUT_S) -> list[bytes]:
    """The certificates (PEM) the server at ``addr`` presents, its own first; JoinError when it speaks no TLS."""
    try:
        with _handshake(addr, timeout=timeout) as tls:
            chain = tls._sslobj.get_unverified_chain() or []  # type: ignore[union-attr]  # public in 3.13
    except ssl.SSLError as e:
        raise JoinError(f"{addr} did not answer TLS ({e.reason or e}); is it the join port of a control plane "
                        "that runs without --insecure? `llmgw token create` prints the address to use") from None
    except OSError as e:
        raise JoinError(f"cannot reach {addr}: {e.strerror or e}; is the control plane running, and is this its "
                        "join port?") from None
    return [x509.load_der_x509_certificate(c.public_bytes(_DER)).public_bytes(serialization.Encoding.PEM)
            for c in chain]


def pick_ca(chain: list[bytes], ca_hash: str) -> bytes:
    """The chain's certificate whose key has ``ca_hash``; JoinError naming the hashes found when none has."""
    found = []
    for pem in chain:
        try:
            pki.check_ca_hash(pem, ca_hash)
            return pem
        except pki.PkiError as e:
            if "expected sha256:" in str(e):  # the hash given is malformed: no point in looking further
                raise JoinError(str(e)) from None
            found.append(pki.ca_hash(pem))
    raise JoinError(f"no certificate the server presented has the CA hash {ca_hash} (it presented {', '.join(found)}"
                    "); this is not the cluster the join command came from, or someone is in between: check the "
                    "server address and ask its administrator for a new join command")


@dataclasses.dataclass(frozen=True, slots=True)
class Joined:
    node_id: str
    pki: nodepki.NodePki
    servers: list[str]


def join(*, server: str, token: str, ca_hash: str, node_id: str, state_dir: Path) -> Joined:
    """Joins the cluster at ``server`` (its join port) and writes ``<state_dir>/pki``; JoinError saying why not."""
    found = nodepki.of(state_dir)
    if found is not None:
        raise JoinError(nodepki.already_joined(found))
    chain = server_chain(server)
    ca_pem = pick_ca(chain, ca_hash)  # before anything of ours is sent
    host, _ = split(server)
    names = pki.subject_alt_names(chain[0])
    if names and host not in names:
        # gRPC would refuse the name with "Peer name ... is not in peer certificate", naming no way out.
        raise JoinError(f"the server's certificate names {', '.join(names)}, not {host}: give --server one of "
                        "those, or put this name in it on the control plane (`llmgw init --host`)")
    key = pki.new_key()
    request = pb.JoinRequest(token=token, csr_pem=pki.create_csr(node_id, key), node_id=node_id)
    # Only the cluster's CA is trusted here: never the system's store (grpc would add it for root None).
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    with grpc.secure_channel(server, creds) as channel:
        try:
            reply = agent_pb2_grpc.AgentServiceStub(channel).Join(request, timeout=TIMEOUT_S)
        except grpc.RpcError as e:
            raise JoinError(f"the control plane at {server} refused to join this node: "
                            f"{e.details() or e.code().name}") from None  # type: ignore[attr-defined]
    cert = pki.load_cert(reply.cert_pem)
    ours = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = cert.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    if ours != theirs or pki.common_name(reply.cert_pem) != reply.node_id:
        raise JoinError("the control plane answered with a certificate that is not for this node's key and id; "
                        "nothing was written; try again, and report it if it repeats")
    servers = [f"[{host}]:{reply.agent_port}" if ":" in host else f"{host}:{reply.agent_port}"]
    written = nodepki.write(state_dir, ca_pem=ca_pem, cert_pem=reply.cert_pem, key_pem=pki.key_pem(key),
                            servers=servers, node_id=reply.node_id)
    log.info("joined the cluster at %s as node %s; certificate in %s, the agent stream at %s", server,
             reply.node_id, written.dir, servers[0])
    return Joined(reply.node_id, written, servers)


class Speaks(enum.Enum):
    TLS = "TLS"
    PLAINTEXT = "plaintext"
    UNREACHABLE = "unreachable"  # down or refused: not a mismatch, the agent keeps trying


def probe(addr: str, *, timeout: float = 3.0) -> Speaks:
    """Whether ``addr`` answers a TLS handshake (a server alert about our missing certificate counts as TLS)."""
    try:
        with _handshake(addr, timeout=timeout):
            return Speaks.TLS
    except ssl.SSLError as e:
        # An alert is a TLS server talking (it wants a client certificate); anything else (a wrong version
        # number, an EOF mid-handshake) is a server that read our ClientHello as something else.
        return Speaks.TLS if "ALERT" in str(e.reason or e).upper() else Speaks.PLAINTEXT
    except (ConnectionRefusedError, TimeoutError, socket.gaierror):
        return Speaks.UNREACHABLE
    except OSError:
        # Reset or closed mid-handshake: gRPC's plaintext server hangs up on a ClientHello.
        return Speaks.PLAINTEXT


def check_mode(servers: tuple[str, ...] | list[str], *, tls: bool, timeout: float = 3.0) -> None:
    """Refuses to start when the first server that answers speaks the other protocol; none answering is no mismatch."""
    for addr in servers:
        speaks = probe(addr, timeout=timeout)
        if speaks is Speaks.UNREACHABLE:
            continue
        if tls and speaks is Speaks.PLAINTEXT:
            raise LlmgwError(f"this agent has certificates (mutual TLS), and the control plane at {addr} speaks "
                             "plaintext: it runs with --insecure. Run the server without --insecure, or this agent "
                             "with --insecure (loopback only)")
        if not tls and speaks is Speaks.TLS:
            raise LlmgwError(f"this agent runs with --insecure (plaintext), and the control plane at {addr} speaks "
                             "TLS: join this node with `llmgw agent join` (`llmgw token create` on the control "
                             "plane prints the command) and run it without --insecure")
        return
