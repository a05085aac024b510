"""TLS on the engines this node serves: when, with which key and certificate, and how the agent checks them.

``engine_tls`` (agent.yaml, ``LLMGW_AGENT_ENGINE_TLS``, ``--engine-tls``): ``auto`` (the default) serves TLS when
engines listen on an address other than loopback, where a router on another host reaches them; ``on`` always
(tests use it on loopback); ``off`` never. With TLS an engine's endpoint is ``https://HOST:PORT``.

The engines' key is the node's second key, ``<state_dir>/pki/engine.key`` (0600), never the node's own: an
engine runs as a user of its own and may run a model's code, and the node key opens the agent stream. Its
certificate (``engine.crt``) comes from the control plane over the stream (RenewCert with purpose ENGINE,
``session.enginecert``): CN = the node id, OU ``llmgw-engine``, server auth only, no subject alternative name
(``pki.sign_engine_csr`` says why). It is asked for at registration and again in the last third of its life.
Each engine gets a copy of both in its shard's private work dir (0600, its own user's), removed with it.

Who connects to an engine checks the certificate chains to the cluster CA and that ``pki.engine_node`` of it is
the node the endpoint is on; not the host name (there is none in the certificate). The agent's own probes do
(``client_context``: both in the TLS handshake), as routers do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import ipaddress
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from llmgw.agent.engines.base import TlsFiles
from llmgw.core import pki
from llmgw.core.errors import EngineError, LlmgwError

KEY_FILE = "engine.key"
CERT_FILE = "engine.crt"
#: How long a start waits for the control plane's engine certificate before it is refused.
WAIT_S = 30.0


class Mode(enum.StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def wanted(mode: Mode | str, host: str) -> bool:
    """Whether an engine listening on ``host`` serves TLS under ``mode``."""
    mode = Mode(mode)
    return mode is Mode.ON or (mode is Mode.AUTO and not is_loopback(host))


def scheme(tls: bool) -> str:
    return "https" if tls else "http"


def peer_problem(der: bytes | None, node_id: str) -> str | None:
    """Why the engine certificate ``der`` (verified against the cluster CA) is not ``node_id``'s; None if it is."""
    if not der:
        return "the engine presented no certificate"
    cert = x509.load_der_x509_certificate(der)
    got = pki.engine_node(cert)
    if got is None:
        return f"the engine's certificate ({cert.subject.rfc4514_string()}) is not an llmgw engine certificate"
    if got != node_id:
        return f"the engine's certificate is node {got!r}'s engine certificate, not this node's ({node_id!r})"
    return None


class _EngineTlsObject(ssl.SSLObject):
    """An ``SSLObject`` whose handshake also fails unless the peer shows ``node``'s engine certificate."""

    node = ""

    def do_handshake(self) -> None:
        super().do_handshake()
        why = peer_problem(self.getpeercert(binary_form=True), self.node)
        if why:
            raise ssl.SSLCertVerificationError(why)


class _EngineTlsSocket(ssl.SSLSocket):
    """The same check for blocking sockets (``wrap_socket``: urllib, httpx's sync client)."""

    node = ""

    def do_handshake(self, block: bool = False) -> None:
        super().do_handshake(block)
        why = peer_problem(self.getpeercert(binary_form=True), self.node)
        if why:
            raise ssl.SSLCertVerificationError(why)


def client_context(ca_pem: bytes, node_id: str) -> ssl.SSLContext:
    """Verifies an engine at each handshake: its certificate chains to the cluster CA, and it is ``node_id``'s
    engine certificate (``peer_problem``); no host name (engine certificates carry none).

    The node check is in the handshake (``SSLContext.sslobject_class``, which asyncio's TLS uses, and
    ``sslsocket_class`` for blocking sockets), so every connection is checked before a byte of a request goes
    over it, whatever client library sits on top.
    """
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.sslobject_class = type("EngineTlsObject", (_EngineTlsObject,), {"node": node_id})
    ctx.sslsocket_class = type("EngineTlsSocket", (_EngineTlsSocket,), {"node": node_id})
    return ctx


def wanted_by(tls: EngineTls | None, host: str) -> bool:
    """Whether an engine on ``host`` serves TLS under this agent's ``tls`` (None: never)."""
    return tls is not None and tls.wanted(host)


def client_ssl(tls: EngineTls | None) -> ssl.SSLContext | bool:
    """What the agent's probes verify https engines with (``client_context``; True, the system's, without TLS)."""
    return client_context(tls.ca_pem(), tls.node_id) if tls is not None and tls.usable() else True


@dataclasses.dataclass(frozen=True, slots=True)
class Material:
    """An engine key and its certificate, PEM: what each engine started with TLS gets a copy of."""

    key_pem: bytes = dataclasses.field(repr=False)
    cert_pem: bytes


def place(work_dir: Path, material: Material) -> TlsFiles:
    """Writes the engine's copy of the key and certificate into its work dir, 0600 (the plan then gives the
    work dir to the engine's user)."""
    key, cert = work_dir / KEY_FILE, work_dir / CERT_FILE
    for path, data in ((key, material.key_pem), (cert, material.cert_pem)):
        _write_private(path, data)
    return TlsFiles(key=str(key), cert=str(cert))


class EngineTls:
    """This node's engine key and certificate on disk, and the certificate's arrival from the control plane.

    The session (``session.enginecert``) asks and delivers; the supervisor waits for a certificate
    (``material``) before it starts an engine with TLS.
    """

    def __init__(self, *, mode: Mode | str, pki_dir: Path | None, node_id: str, wait_s: float = WAIT_S) -> None:
        self.mode, self.pki_dir, self.node_id, self.wait_s = Mode(mode), pki_dir, node_id, wait_s
        self._arrived: asyncio.Event | None = None
        #: Why the control plane last refused ("" when it did not): a start waiting for the certificate says it.
        self.refused = ""

    @property
    def key_path(self) -> Path:
        assert self.pki_dir is not None
        return self.pki_dir / KEY_FILE

    @property
    def cert_path(self) -> Path:
        assert self.pki_dir is not None
        return self.pki_dir / CERT_FILE

    def wanted(self, host: str) -> bool:
        """Whether engines on ``host`` serve TLS; auto without certificates (--insecure) is plain, as the agent
        warned at start (on without them is refused at start)."""
        if self.mode is Mode.AUTO and self.pki_dir is None:
            return False
        return wanted(self.mode, host)

    def usable(self) -> bool:
        """Whether this agent can have an engine certificate at all (it joined: it has a CA and a stream with TLS)."""
        return self.pki_dir is not None and self.mode is not Mode.OFF

    def private_key(self) -> ec.EllipticCurvePrivateKey:
        """The engine key, made (0600) the first time it is needed."""
        path = self.key_path
        if not path.exists():
            _write_private(path, pki.key_pem(pki.new_key()), replace=False)
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise LlmgwError(f"{path} is not an EC key; remove it and the agent makes a new one")
        return key

    def csr(self) -> bytes:
        return pki.create_csr(self.node_id, self.private_key())

    def cert_pem(self) -> bytes | None:
        try:
            return self.cert_path.read_bytes()
        except FileNotFoundError:
            return None

    def ca_pem(self) -> bytes:
        assert self.pki_dir is not None
        return (self.pki_dir / "ca.crt").read_bytes()

    def due(self, *, now: datetime.datetime | None = None) -> bool:
        """Whether to ask for a certificate: none yet, not for the present key, or in the last third of its life."""
        pem = self.cert_pem()
        if pem is None:
            return True
        try:
            cert = pki.load_cert(pem)
        except LlmgwError:
            return True
        if not self._matches(cert):
            return True
        now = now or datetime.datetime.now(datetime.UTC)
        life = cert.not_valid_after_utc - (cert.not_valid_before_utc + pki.CLOCK_SKEW)
        return cert.not_valid_after_utc - now < life / 3

    def check(self, cert_pem: bytes) -> None:
        """LlmgwError unless ``cert_pem`` is this node's engine certificate for the engine key."""
        cert = pki.load_cert(cert_pem)
        if pki.engine_node(cert) != self.node_id:
            raise LlmgwError(f"it is not node {self.node_id}'s engine certificate ({cert.subject.rfc4514_string()})")
        if not self._matches(cert):
            raise LlmgwError("it is not for this node's engine key (an answer to an earlier request?)")

    def store(self, cert_pem: bytes) -> None:
        """Takes a certificate from the control plane: checked, written beside the old one and renamed over it."""
        self.check(cert_pem)
        _write_private(self.cert_path, cert_pem)
        self.refused = ""
        self._event().set()

    def refuse(self, why: str) -> None:
        self.refused = why
        self._event().set()

    async def material(self) -> Material:
        """The key and a valid certificate for it; waits up to ``wait_s`` for the control plane's answer.

        EngineError, saying what to do, when none comes: a start with TLS is refused rather than served plain.
        """
        if not self.usable():
            raise EngineError("engine_tls is on, and this agent has no certificates to get an engine certificate "
                              "with (--insecure?); join the node with `llmgw agent join`, or set engine_tls to off")
        deadline = asyncio.get_running_loop().time() + self.wait_s
        while True:
            pem = self.cert_pem()
            if pem is not None and not self._expired(pem):
                try:
                    self.check(pem)
                    return Material(key_pem=self.key_path.read_bytes(), cert_pem=pem)
                except LlmgwError:
                    pass
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                why = f": {self.refused}" if self.refused else ""
                raise EngineError(f"no engine certificate from the control plane within {self.wait_s:g} s{why}; "
                                  "the agent asks at registration (is it connected? is the control plane older "
                                  "than engine TLS?), or set engine_tls to off")
            event = self._event()
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), min(left, 1.0))
            except TimeoutError:
                pass

    def _matches(self, cert: x509.Certificate) -> bool:
        try:
            mine = self.private_key().public_key().public_numbers()
        except (OSError, LlmgwError):
            return False
        theirs = cert.public_key()
        return isinstance(theirs, ec.EllipticCurvePublicKey) and theirs.public_numbers() == mine

    @staticmethod
    def _expired(pem: bytes) -> bool:
        try:
            return pki.not_after(pem) <= datetime.datetime.now(datetime.UTC)
        except LlmgwError:
            return True

    def _event(self) -> asyncio.Event:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        return self._arrived


def _write_private(path: Path, data: bytes, *, replace: bool = True) -> None:
    """``data`` in ``path``, 0600 from its creation; beside it and renamed over it when ``replace``."""
    target = path.with_name(f".{path.name}.{os.getpid()}") if replace else path
    if replace:
        target.unlink(missing_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if replace:
        os.replace(target, path)
