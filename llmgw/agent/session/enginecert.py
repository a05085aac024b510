"""The engines' certificate over the stream: asked for at registration and at heartbeats once due, taken when issued.

A RenewCert with purpose ENGINE carries a CSR of the engine key (``enginetls``), never the node's; the control
plane signs it for the stream's node id. One request at a time per stream; a new stream may ask again.
"""

from __future__ import annotations

import logging

from llmgw.agent.enginetls import EngineTls
from llmgw.agent.session.outbox import Outbox
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)


class EngineCertRenewal:
    """Keeps this node's engine certificate: asks when there is none or it is in the last third of its life."""

    def __init__(self, tls: EngineTls | None) -> None:
        self._tls = tls
        #: A request is out and not yet answered.
        self.asking = False

    def ask_if_due(self, outbox: Outbox) -> None:
        tls = self._tls
        if tls is None or not tls.usable() or self.asking:
            return
        try:
            if not tls.due():
                return
            csr = tls.csr()
        except (LlmgwError, OSError) as e:
            log.warning("cannot ask for an engine certificate: %s", e)
            return
        self.asking = True
        log.info("asking the control plane for this node's engine certificate (engine_tls %s)", tls.mode)
        outbox.send(renew_cert=pb.RenewCert(csr_pem=csr, purpose=pb.CERT_PURPOSE_ENGINE))

    def issued(self, issued: pb.CertIssued) -> None:
        self.asking = False
        if self._tls is None:
            return
        if issued.error or not issued.cert_pem:
            why = issued.error or "it sent no certificate"
            log.warning("the control plane issued no engine certificate: %s", why)
            self._tls.refuse(why)
            return
        try:
            self._tls.store(issued.cert_pem)
        except (LlmgwError, OSError) as e:
            log.warning("the engine certificate from the control plane was not stored: %s", e)
            self._tls.refuse(f"its certificate was refused: {e}")
            return
        log.info("stored this node's engine certificate in %s", self._tls.cert_path)
