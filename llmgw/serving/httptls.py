"""TLS on ``llmgw server``'s HTTP port, as ``serving.config.tls_plan`` decided: the context, its watch, its marks.

:func:`prepare` (before the port is bound) makes what the plan asks for: with a cluster-CA certificate, issued
into ``DATA_DIR/pki`` (``apicert``) and renewed by a ``apicert.Renewer``; with the operator's
``--tls-cert/--tls-key``, those files, checked now (a refusal names the flag). Either way one
``router.tlslisten.CertReloader`` watches the two files the listener serves, and the router workers are given
the same two paths (never the key's bytes) to watch themselves. ``marks`` are the headers every answer carries:
HSTS on HTTPS, ``X-Llmgw-Plain-Http: 1`` with ``--plain-http``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
from pathlib import Path

from llmgw.control import datadir
from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.router import httphead, tlslisten
from llmgw.serving import apicert
from llmgw.serving.config import ServerConfig, TlsPlan

log = logging.getLogger("llmgw.serve")


@dataclasses.dataclass(slots=True)
class HttpTls:
    """What the HTTP port serves TLS with; plain when ``reloader`` is None."""

    plan: TlsPlan
    reloader: tlslisten.CertReloader | None = None
    renewer: apicert.Renewer | None = None
    #: The cluster CA's hash (``sha256:…``) users pin, for a cluster-CA certificate; "" otherwise.
    ca_hash: str = ""
    _tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)

    @property
    def context(self) -> ssl.SSLContext | None:
        return self.reloader.context if self.reloader is not None else None

    @property
    def files(self) -> tuple[Path, Path] | None:
        """The certificate and key files the listener serves (and the router workers watch)."""
        return (self.reloader.cert, self.reloader.key) if self.reloader is not None else None

    @property
    def marks(self) -> tuple[tuple[bytes, bytes], ...]:
        if self.reloader is not None:
            return (httphead.HSTS,)
        return (httphead.PLAIN_HTTP_MARK,) if self.plan.marked_plain else ()

    def describe(self) -> str:
        """How the port is served, for the start's log line."""
        if self.reloader is None:
            return "plain HTTP, behind a TLS-terminating proxy (--plain-http)" if self.plan.marked_plain \
                else "plain HTTP"
        if self.renewer is not None:
            return (f"HTTPS with a certificate from the cluster CA {self.ca_hash} ({self.reloader.cert}; trust "
                    f"{datadir.ca_cert(self.renewer.data_dir)} or pin the hash)")
        return f"HTTPS with {self.reloader.cert} (re-read when it changes)"

    def start_watching(self) -> None:
        if self.reloader is not None:
            self._tasks.append(asyncio.create_task(self.reloader.run()))
        if self.renewer is not None:
            self._tasks.append(asyncio.create_task(self.renewer.run()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()


def prepare(cfg: ServerConfig) -> HttpTls:
    """The HTTP port's TLS per ``cfg.tls``; LlmgwError, naming the flag, when the certificate cannot be had."""
    plan = cfg.tls
    if plan.warning:
        log.warning("%s", plan.warning)
    if not plan.on:
        return HttpTls(plan)
    if plan.cert is not None and plan.key is not None:
        try:
            return HttpTls(plan, tlslisten.CertReloader(plan.cert, plan.key))
        except tlslisten.TlsFilesError as e:
            raise LlmgwError(str(e)) from None
    hosts = apicert.names(host=cfg.host, advertise=cfg.advertise, sans=plan.sans)
    try:
        apicert.ensure(cfg.data_dir, hosts, plan.validity_s)
        crt, key = apicert.paths(cfg.data_dir)
        reloader = tlslisten.CertReloader(crt, key, cert_flag=str(crt), key_flag=str(key))
        ca_hash = pki.ca_hash(datadir.read_ca(cfg.data_dir).cert_pem)
    except (OSError, pki.PkiError, tlslisten.TlsFilesError) as e:
        raise LlmgwError(f"cannot make the HTTP port's certificate from the cluster CA in "
                         f"{cfg.data_dir / datadir.PKI}: {e}; give --tls-cert/--tls-key, or --plain-http behind a "
                         "TLS-terminating proxy") from None
    return HttpTls(plan, reloader, apicert.Renewer(cfg.data_dir, hosts, plan.validity_s, reloader), ca_hash)
