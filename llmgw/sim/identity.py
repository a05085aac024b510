"""The fleet simulator's onboarding: one join token for every simulated node, a key and certificate each.

A real node joins with ``llmgw agent join`` (``llmgw.agent.join``) and dials the agent port with mutual
TLS; so does each simulated node here, through the same ports and the same checks on the control plane:

1. The join port's chain is read once and its CA checked against ``--ca-hash`` before the token is sent
   anywhere (``join.server_chain``, ``join.pick_ca``), as the real join does.
2. Each node makes its own ECDSA P-256 key (about 0.1 ms with ``cryptography``), sends a CSR with the one
   many-use token (``llmgw token create --uses N``), and gets its certificate, ``in_flight`` joins at a
   time on one channel to the join port (the control plane signs them one at a time on its store's
   thread; more in flight only queue there).
3. Each node then has a channel of its own to the agent port (a TLS connection carries one client
   certificate), and renews over its stream as the real agent does (``session._maybe_renew``): at a
   heartbeat in the last third of the certificate's life, one RenewCert with a CSR of its own key.

``save``/``load`` keep the identities in one JSON file (``--state-dir``), so a fleet restarted against
the same control plane does not join again: its node ids already hold certificates there, and a second
join for a node is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from llmgw.agent import join as join_mod
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import pki
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)
JOIN_METHOD = "/llmgw.v1.AgentService/Join"
IN_FLIGHT = 64
STATE_FILE = "fleet-identities.json"
#: Join answers retried (the control plane busy or restarting), at most this many times a node.
RETRIES = 5


class FleetError(LlmgwError):
    """The fleet cannot run as asked; the message says why and what to do."""


@dataclasses.dataclass(slots=True)
class Identity:
    """A simulated node's key and certificate (PEM), and when the certificate asks to be renewed."""

    key_pem: bytes = dataclasses.field(repr=False)
    cert_pem: bytes
    #: Unix time at which the certificate enters the last third of its life (``NodePki.renew_due``'s rule).
    renew_at: float = 0.0

    def __post_init__(self) -> None:
        if not self.renew_at:
            self.renew_at = renew_time(self.cert_pem)

    def renewed(self, cert_pem: bytes) -> None:
        self.cert_pem = cert_pem
        self.renew_at = renew_time(cert_pem)

    def csr(self, node_id: str) -> bytes:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return pki.create_csr(node_id, key)


def renew_time(cert_pem: bytes) -> float:
    cert = pki.load_cert(cert_pem)
    life = cert.not_valid_after_utc - (cert.not_valid_before_utc + pki.CLOCK_SKEW)
    return (cert.not_valid_after_utc - life / 3).timestamp()


@dataclasses.dataclass(slots=True)
class Trust:
    """What every node shares: the cluster's CA (checked against the hash) and the agent addresses."""

    ca_pem: bytes
    servers: tuple[str, ...]
    identities: dict[str, Identity] = dataclasses.field(default_factory=dict)


async def cluster_ca(join_addr: str, ca_hash: str) -> bytes:
    """The CA of the server at ``join_addr`` whose key has ``ca_hash``; FleetError saying why not."""
    try:
        chain = await asyncio.to_thread(join_mod.server_chain, join_addr)
        return join_mod.pick_ca(chain, ca_hash)
    except join_mod.JoinError as e:
        raise FleetError(f"--join {join_addr}: {e}") from None


async def join_all(node_ids: Sequence[str], *, join_addr: str, token: str, ca_pem: bytes,
                   in_flight: int = IN_FLIGHT) -> tuple[dict[str, Identity], int]:
    """Joins every node in ``node_ids``; their identities and the agent port; FleetError on the first refusal."""
    limit = asyncio.Semaphore(in_flight)
    out: dict[str, Identity] = {}
    agent_port = 0
    channel = grpc.aio.secure_channel(join_addr, grpc.ssl_channel_credentials(root_certificates=ca_pem))
    call = channel.unary_unary(JOIN_METHOD, request_serializer=pb.JoinRequest.SerializeToString,
                               response_deserializer=pb.JoinReply.FromString)

    async def one(node_id: str) -> None:
        nonlocal agent_port
        async with limit:
            key = pki.new_key()
            request = pb.JoinRequest(token=token, csr_pem=pki.create_csr(node_id, key), node_id=node_id)
            for attempt in range(RETRIES + 1):
                try:
                    reply = await call(request, timeout=join_mod.TIMEOUT_S * 3)
                    break
                except grpc.aio.AioRpcError as e:
                    retry = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                    if not retry or attempt == RETRIES:
                        raise FleetError(f"the control plane at {join_addr} refused to join node {node_id} "
                                         f"({len(out)} of {len(node_ids)} joined): {e.details() or e.code().name}"
                                         f"{_hint(e.details() or '')}") from None
                    await asyncio.sleep(0.2 * (attempt + 1))
        out[node_id] = Identity(pki.key_pem(key), reply.cert_pem)
        agent_port = reply.agent_port

    started = time.monotonic()
    tasks = [asyncio.create_task(one(n)) for n in node_ids]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.close()
    log.info("fleet: %d nodes joined through %s in %.1fs", len(out), join_addr, time.monotonic() - started)
    return out, agent_port


def _hint(detail: str) -> str:
    if "already has a certificate" in detail:
        return ("; these node ids joined this control plane before: keep their certificates across runs with "
                "--state-dir, or name them anew with --prefix")
    if "uses" in detail or "used" in detail:
        return "; the token allows fewer joins than --nodes: make one with `llmgw token create --uses N`"
    return ""


def load(state_dir: Path) -> Trust | None:
    """The identities ``save`` kept in ``state_dir``; None when there are none."""
    path = state_dir / STATE_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise FleetError(f"cannot read the fleet's identities in {path}: {e}; remove it to join afresh") from None
    return Trust(doc["ca_pem"].encode(), tuple(doc["servers"]),
                 {n: Identity(k.encode(), c.encode()) for n, (k, c) in doc["nodes"].items()})


def save(state_dir: Path, trust: Trust) -> None:
    """Writes every node's key and certificate to one 0600 file (written beside, then renamed over)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path, tmp = state_dir / STATE_FILE, state_dir / f".{STATE_FILE}.{os.getpid()}"
    doc = {"ca_pem": trust.ca_pem.decode(), "servers": list(trust.servers), "saved": str(datetime.datetime.now()),
           "nodes": {n: [i.key_pem.decode(), i.cert_pem.decode()] for n, i in trust.identities.items()}}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


async def check_plaintext(servers: Sequence[str]) -> None:
    """Refuses a plaintext fleet against a control plane that speaks TLS (it would only ever count 0 registered)."""
    for addr in servers:
        speaks = await asyncio.to_thread(join_mod.probe, addr)
        if speaks is join_mod.Speaks.UNREACHABLE:
            continue
        if speaks is join_mod.Speaks.TLS:
            raise FleetError(
                f"the control plane at {addr} speaks TLS (it runs without --insecure) and refuses plaintext nodes: "
                "give the fleet a join token and the CA's hash: `llmgw token create --uses N` prints both "
                "(--token, --ca-hash) and the join port (--join HOST:PORT); or run the server with --insecure")
        return


async def check_tls(servers: Sequence[str]) -> None:
    """Refuses a TLS fleet against a plaintext control plane, naming the cause gRPC would not."""
    for addr in servers:
        speaks = await asyncio.to_thread(join_mod.probe, addr)
        if speaks is join_mod.Speaks.UNREACHABLE:
            continue
        if speaks is join_mod.Speaks.PLAINTEXT:
            raise FleetError(f"the control plane at {addr} speaks plaintext (it runs with --insecure): run the fleet "
                             "with --insecure and no --token")
        return
