"""What the agent sends on a timer: a heartbeat each interval, and the renewal of its certificates.

The certificate is renewed over the stream, never by reconnecting: at each heartbeat, once it is in the
last third of its life, one RenewCert goes out (a CSR made with the node's own key), and the answer
replaces ``node.crt`` for the next connection; the stream that asked goes on. The engines' certificate
is asked for at the same beat once due (``enginecert``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from llmgw.agent import nodepki
from llmgw.agent.session.enginecert import EngineCertRenewal
from llmgw.agent.session.outbox import Outbox
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Heartbeat

log = logging.getLogger(__name__)


class Renewal:
    """This node's certificate renewal: asked for at a heartbeat once due, one at a time, taken when issued."""

    def __init__(self, node_id: str, tls: nodepki.NodePki | None) -> None:
        self._node_id, self._tls = node_id, tls
        #: A RenewCert is out and not yet answered (one at a time; a new stream may ask again).
        self.renewing = False

    def ask_if_due(self, outbox: Outbox) -> None:
        tls = self._tls
        if tls is None or self.renewing:
            return
        try:
            if not tls.renew_due():
                return
            csr = pki.create_csr(self._node_id, tls.private_key())
        except LlmgwError as e:
            log.warning("cannot renew this node's certificate: %s", e)
            return
        self.renewing = True
        log.info("this node's certificate is in the last third of its life; asking the control plane for a new one")
        outbox.send(renew_cert=pb.RenewCert(csr_pem=csr))

    def issued(self, issued: pb.CertIssued) -> None:
        """Takes the control plane's answer: the new certificate stored for the next connection, or why not."""
        self.renewing = False
        if issued.error or self._tls is None:
            log.warning("the control plane did not renew this node's certificate: %s; asking again at the next "
                        "heartbeat", issued.error or "it sent no certificate")
            return
        try:
            if pki.common_name(issued.cert_pem) != self._node_id:
                raise LlmgwError(f"it names node {pki.common_name(issued.cert_pem)!r}, not {self._node_id!r}")
            # A control plane older than engine certificates answers an engine request as a node one: that
            # certificate is for the engine key, and over node.crt it would lock the node out.
            if (pki.load_cert(issued.cert_pem).public_key().public_numbers()
                    != self._tls.private_key().public_key().public_numbers()):
                raise LlmgwError("it is not for this node's key (an answer to the engine key's request from a "
                                 "control plane that predates engine certificates?)")
            self._tls.replace_cert(issued.cert_pem)
        except (LlmgwError, OSError) as e:
            log.warning("the renewed certificate was not stored: %s; the old one stays", e)
            return
        log.info("renewed this node's certificate (valid until %s); the next connection uses it",
                 pki.load_cert(issued.cert_pem).not_valid_after_utc.isoformat())


async def beat(interval_s: float, heartbeat: Callable[[], Heartbeat], outbox: Outbox, renewal: Renewal,
               engine: EngineCertRenewal | None = None) -> None:
    """Sends a heartbeat every ``interval_s`` (each read in a thread, off the event loop), until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        hb = await asyncio.to_thread(heartbeat)
        outbox.send(heartbeat=convert.heartbeat_to_pb(hb))
        renewal.ask_if_due(outbox)
        if engine is not None:
            engine.ask_if_due(outbox)
