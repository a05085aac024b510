"""The router's settings: one dataclass per process, its flags, defaults and help written once here.

:class:`ProxySettings` is how the router serves requests (body size, keepalive, admission, HTTP limits,
tracing, load reports): the standalone router has it and so has ``llmgw server``, whose in-process
router it configures. :class:`RouterSettings` is the standalone router's process: where its table
comes from, where it listens, and its ``ProxySettings``. ``python -m llmgw.router.standalone``,
``llmgw router`` and ``llmgw server`` generate their flags from these (``llmgw.core.settingsgen``).

Light on purpose: the CLI imports it to make its flags, before any of the router is needed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import ClassVar

from llmgw.core.settingsgen import nested, setting
from llmgw.router import limits

#: The router's credential for the control plane when no --token-file is given.
TOKEN_ENV = "LLMGW_ROUTER_TOKEN"
#: Where the OTLP collector's URL comes from when no --tracing-endpoint is given.
TRACING_ENV = "LLMGW_TRACING_ENDPOINT"
#: Set in a worker's environment by its hub (``router.hub``): the hub's pid. A worker listens with SO_REUSEPORT
#: and stops once its parent is not that pid. Not a setting (no ``LLMGW_ROUTER_`` prefix): no one gives it.
HUB_PID_ENV = "LLMGW_HUB_PID"
#: Set (to "1") by a hub serving a static table: its workers send no usage records, load reports or events,
#: which nobody there would store or read (metering alone is a quarter of a core at capacity: issue 26).
HUB_STATIC_ENV = "LLMGW_HUB_STATIC"
#: ``--workers 0`` (the default) serves with one process per core, at most this many: past it, the hub's
#: relay and the engines, not the routers' CPU, are what limits a machine.
AUTO_WORKERS_CAP = 8
#: The most ``--workers`` takes.
MAX_WORKERS = 256


def control_urls(value: str) -> tuple[str, ...]:
    """``URL[,URL...]``: a malformed one is a usage error naming it, not an outage logged on every poll."""
    from llmgw.router import watch  # aiohttp: not for a CLI that only makes its flags

    return watch.parse_control_urls(value)


def positive_seconds(value: str) -> float:
    """Seconds > 0, finite; ValueError saying what was given."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(f"expected seconds > 0, got {value!r}")
    return seconds


@dataclasses.dataclass(frozen=True, slots=True)
class ProxySettings:
    """How the router serves requests, alone or in ``llmgw server``; validated when made."""

    max_body_bytes: int = setting(32 << 20, metavar="BYTES",
                                  help="larger request bodies are refused with 413 (default 32 MiB)")
    keepalive: float = setting(15.0, metavar="SECONDS",
                               help="an SSE comment this often while a stream waits for its first token; 0: off")
    header_timeout: float = setting(limits.HEADER_TIMEOUT_S, metavar="SECONDS", min=0,
                                    help=limits.FLAG_HELP["header_timeout_s"])
    body_timeout: float = setting(limits.BODY_TIMEOUT_S, metavar="SECONDS", min=0,
                                  help=limits.FLAG_HELP["body_timeout_s"])
    idle_timeout: float = setting(limits.IDLE_TIMEOUT_S, metavar="SECONDS", min=0,
                                  help=limits.FLAG_HELP["idle_timeout_s"])
    max_connections_per_address: int = setting(limits.MAX_PER_ADDRESS, metavar="N", min=0,
                                               help=limits.FLAG_HELP["max_per_address"])
    tracing_endpoint: str = setting("", metavar="URL", env=TRACING_ENV,
                                    help="export OpenTelemetry spans over OTLP/HTTP to this collector, e.g. "
                                         f"http://127.0.0.1:4318 [env {TRACING_ENV}; default: off]")
    admission_queue: int = setting(100, metavar="N",
                                   help="requests that may wait per model when it is at its concurrency limit")
    admission_wait: float = setting(30.0, metavar="SECONDS",
                                    help="how long one may wait for a slot before a 429 with Retry-After")
    batch_concurrency: int = setting(4, metavar="N", min=0, max=1024,
                                     help="batch lines (issue 32) this router runs at once per model, only while the "
                                          "model's admission queue is empty and its engines' queues are short; 0: "
                                          "this router runs no batch lines")
    batch_waiting_below: float = setting(1.0, metavar="N", min=0,
                                         help="a batch line starts only while the model's engines report fewer "
                                              "requests waiting than this (their own queue, last scrape)")
    admission_order: str = setting("fair", metavar="fair|fifo",
                                   help="within a priority class, admit waiting requests by their projects' weighted "
                                        "fair shares (fair) or first come first served (fifo)")
    signals_interval: float = setting(2.0, metavar="SECONDS", parse=positive_seconds,
                                      help="how often the load the autoscaler scales on is reported to the control "
                                           "plane (a request held for a model at zero is reported at once)")

    def __post_init__(self) -> None:
        self.limits   # noqa: B018  (ValueError naming the limit that is out of range)
        if self.tracing_endpoint and not self.tracing_endpoint.strip().startswith(("http://", "https://")):
            raise ValueError(f"--tracing-endpoint {self.tracing_endpoint!r}: expected http://HOST:PORT of an "
                             "OTLP/HTTP collector")
        if not 0 < self.signals_interval < math.inf:
            raise ValueError(f"--signals-interval: expected seconds > 0, got {self.signals_interval!r}")
        if self.admission_order not in ("fair", "fifo"):
            raise ValueError(f"--admission-order: expected fair or fifo, got {self.admission_order!r}")

    @property
    def limits(self) -> limits.Limits:
        """The HTTP server's limits on reading requests."""
        return limits.Limits(header_timeout_s=self.header_timeout, body_timeout_s=self.body_timeout,
                             idle_timeout_s=self.idle_timeout, max_per_address=self.max_connections_per_address)


@dataclasses.dataclass(frozen=True, slots=True)
class RouterSettings:
    """``python -m llmgw.router.standalone`` and ``llmgw router``: one router process; validated when made."""

    #: Every setting without a variable of its own is also read from LLMGW_ROUTER_<NAME> (``settingsgen``).
    ENV_PREFIX: ClassVar[str] = "LLMGW_ROUTER_"

    table_file: Path | None = setting(None, group="source", help="a static endpoints document (JSON)")
    control: tuple[str, ...] = setting((), group="source", parse=control_urls, metavar="URL[,URL...]",
                                       help="the control plane's base URL, e.g. http://127.0.0.1:8080; several, "
                                            "comma-separated (a leader and its standbys): the router follows one, "
                                            "and the next when it stops answering")
    control_ca: Path | None = setting(None, metavar="FILE",
                                      help="verify an https:// control plane with this CA certificate (PEM) alone: "
                                           "the cluster's, or an operator's own for `llmgw server --tls-cert` "
                                           "[default: the system's authorities]")
    control_ca_hash: str = setting("", metavar="sha256:HEX",
                                   help="read the cluster CA from an https:// control plane at start and verify "
                                        "with it only if its hash is this (`llmgw server` prints it at start, "
                                        "`llmgw token create` too); another hash stops the router")
    token_file: Path | None = setting(None, help="a file holding this router's credential for the control plane "
                                                 f"(`llmgw router-token create NAME`) [default: the {TOKEN_ENV} "
                                                 "environment variable]")
    host: str = setting("127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    port: int = setting(8080, min=0, max=65535, help="the OpenAI API (/v1) and /metrics")
    tls_cert: Path | None = setting(None, metavar="FILE", help="serve HTTPS with this certificate (PEM: the "
                                    "router's, then its intermediates), re-read when it changes, without a restart; "
                                    "with --tls-key [default: plain HTTP, warned beyond loopback]")
    tls_key: Path | None = setting(None, metavar="FILE", help="the private key of --tls-cert (PEM, unencrypted, 0600)")
    plain_http: bool = setting(False, help="plain HTTP beyond loopback on purpose (behind a TLS-terminating "
                                           "proxy): no warning at start; every answer says so (X-Llmgw-Plain-Http)")
    log_level: str = setting("info", help="the log level: debug, info, warning, error")
    graceful_shutdown: float = setting(30.0, metavar="SECONDS",
                                       help="how long open streams may finish after SIGTERM before they are cut")
    router_id: str = setting("", help="this router's name in the ejections and load it reports to the control "
                                      "plane [default: the hostname]")
    usage_journal_dir: Path | None = setting(None, metavar="DIR",
                                             help="keep the usage records not yet stored by the control plane in "
                                                  "files here, sent again after a restart, so a kill -9 loses none "
                                                  "[default: in memory only: a kill -9 loses up to the last second]")
    workers: int = setting(0, metavar="N", min=0, max=MAX_WORKERS,
                           help="processes serving the port together (SO_REUSEPORT), sharing one table, one "
                                "control-plane subscription and exact limits through a hub (router.hub); 1: one "
                                f"process, no hub [default 0: the number of cores, at most {AUTO_WORKERS_CAP}]")
    proxy: ProxySettings = nested(ProxySettings)

    def __post_init__(self) -> None:
        if not 0 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"--workers: expected 0 (one per core) to {MAX_WORKERS}, got {self.workers}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together: give the certificate and its key, or neither")
        if self.plain_http and self.tls_cert is not None:
            raise ValueError("--plain-http and --tls-cert contradict each other: leave --plain-http out to serve "
                             "HTTPS, or drop --tls-cert/--tls-key behind a TLS-terminating proxy")
        if self.table_file is not None and self.control:
            raise ValueError("give a table file or a control-plane URL, not both")
        if isinstance(self.control, str):   # one URL given as a string: the tuple it stands for
            object.__setattr__(self, "control", control_urls(self.control))
        _check_control_trust(self.control, self.control_ca, self.control_ca_hash)

    @property
    def worker_count(self) -> int:
        """How many processes serve: ``workers``, or with 0 the number of cores, at most ``AUTO_WORKERS_CAP``."""
        return self.workers or max(1, min(os.cpu_count() or 1, AUTO_WORKERS_CAP))

    @property
    def source(self) -> str:
        """Where the routes come from, as the start's log line names it."""
        return str(self.table_file) if self.table_file is not None else ",".join(self.control)


def _check_control_trust(urls: tuple[str, ...], ca_file: Path | None, ca_hash: str) -> None:
    """ValueError for ``--control-ca``/``--control-ca-hash`` that cannot work (``router.controltls`` uses them)."""
    if ca_file is not None and ca_hash:
        raise ValueError("give --control-ca or --control-ca-hash, not both")
    if (ca_file is not None or ca_hash) and not any(u.lower().startswith("https://") for u in urls):
        raise ValueError("--control-ca and --control-ca-hash are for a control plane served over HTTPS: give "
                         "--control https://HOST:PORT")
    digits = ca_hash.removeprefix("sha256:")
    if ca_hash and (not ca_hash.startswith("sha256:") or len(digits) != 64
                    or any(c not in "0123456789abcdefABCDEF" for c in digits)):
        raise ValueError(f"--control-ca-hash {ca_hash!r}: expected sha256: and 64 hex digits, as `llmgw server` "
                         "prints it at start")
