"""The agent's end of the stream: register, heartbeat, carry out commands, reconnect.

The agent always dials; a control plane restart or a partition must never need
anyone to touch a node, so it reconnects forever. Addresses are tried in order
and a failure moves to the next at once; the jittered, capped backoff applies
only after a whole round failed (the next address has not been hammered, and a
fleet reconnecting in lockstep knocks a restarted control plane over again).

Protobuf stops here: commands become core types before the supervisor sees them.

With certificates (``cfg.tls``) each connection reads them afresh and dials with mutual TLS. The
certificate is renewed over the stream, never by reconnecting: at each heartbeat, once it is in the
last third of its life, one RenewCert goes out (a CSR made with the node's own key), and the answer
replaces ``node.crt`` for the next connection; the stream that asked goes on.

With several control planes (one leader, standbys), a standby refuses Register and names the leader: the
agent dials that address next, at once, whatever its place in the rotation. The accepted Register lists
every live control plane; the agent adds those it did not know to its rotation and keeps them in
``STATE_DIR/controlplanes.json``, so a restarted agent whose configured address is the one that died still
finds the others. Each leader's commands carry its term (the lease's fencing token): a command from a term
older than the newest seen comes from a deposed leader that woke from a pause, and is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import grpc

from llmgw.agent import privfile, rejoin
from llmgw.agent.config import AgentConfig
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import fabrictest as ft
from llmgw.core import pki
from llmgw.core import provision as prov
from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Heartbeat, Inventory
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # grpc >= 1.5x waits this long for a ping's answer, whatever keepalive_timeout says (default 60 s):
    # without it a control plane frozen by SIGSTOP (or a VM paused) held the stream 70 s, measured, so
    # the agent came to the standby after its node's grace had run out and its engines were replaced.
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Reconnecting is this module's job, with its own backoff and address
    # rotation; gRPC's own reconnect backoff would hide a dead address.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
REGISTER_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 5.0
#: Where the control planes named by the last accepted Register are kept, in the state directory.
CONTROLPLANES_FILE = "controlplanes.json"
#: At most this many learned addresses are kept: a control plane that lists thousands is wrong, not big.
MAX_LEARNED = 64
MAX_ADDR_LEN = 300
#: Between rounds while a standby answers (a failover under way), instead of the growing backoff.
STANDBY_RETRY_S = 1.0
#: The commands a deposed leader must not get carried out; they carry the sender's term.
FENCED = frozenset({"start_shard", "stop_shard", "drain", "remove_weights", "provision", "fabric_test",
                    "logs_request"})


def control_addr(raw: object) -> str | None:
    """``raw`` when it is a HOST:PORT a control plane can be dialled at (port 1-65535), else None.

    Addresses come from another process (a Register's answer, a file on disk): one with a space or no
    port would be dialled forever and fail each time, and a huge one would be logged on every round.
    """
    if not isinstance(raw, str) or not raw or len(raw) > MAX_ADDR_LEN or any(c.isspace() for c in raw):
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            return None
    elif ":" in host or "[" in host or "]" in host or "/" in host:
        return None  # an IPv6 address must be bracketed, and a URL is not an address
    return raw


def _valid(addrs: Iterable[object], source: str) -> list[str]:
    """The valid, distinct addresses of ``addrs`` in order; each invalid one dropped with a warning."""
    kept: list[str] = []
    for raw in addrs:
        addr = control_addr(raw)
        if addr is None:
            log.warning("ignoring control plane address %.80r from %s: it is not HOST:PORT with a port 1-65535 "
                        "(and no whitespace, at most %d characters)", raw, source, MAX_ADDR_LEN)
        elif addr not in kept:
            kept.append(addr)
    return kept


def read_controlplanes(state_dir: Path) -> list[str]:
    """The control plane addresses a previous run stored; [] (with one warning) when the file is unusable."""
    path = state_dir / CONTROLPLANES_FILE
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []  # the usual first start: no control plane has listed its peers yet
    except (OSError, ValueError, UnicodeDecodeError) as e:
        log.warning("ignoring %s: it cannot be read as JSON (%s); it is rewritten at the next registration",
                    path, e)
        return []
    listed = doc.get("controlplanes") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        log.warning("ignoring %s: it holds no list under \"controlplanes\"; it is rewritten at the next "
                    "registration", path)
        return []
    return _valid(listed, str(path))[:MAX_LEARNED]


def write_controlplanes(state_dir: Path, addrs: Iterable[str]) -> None:
    """Stores ``addrs`` atomically with mode 0600; OSError when the disk refuses."""
    privfile.write_atomic(state_dir / CONTROLPLANES_FILE, json.dumps({"controlplanes": list(addrs)}, indent=1).encode())


async def _connect(channel: grpc.aio.Channel) -> None:
    """Connects, or fails at the first sign it cannot.

    Bounded, because a write on a channel that cannot connect waits forever
    (seen when an agent redialled a control plane that was still restarting:
    it never tried again). And failing on the first TRANSIENT_FAILURE rather
    than waiting out the timeout is what makes a refused address cost nothing
    when there is another one to try.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONNECT_TIMEOUT_S
    state = channel.get_state(try_to_connect=True)
    while state is not grpc.ChannelConnectivity.READY:
        if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise ConnectionRefusedError("refused or unreachable")
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise TimeoutError(f"no connection within {CONNECT_TIMEOUT_S:.0f}s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(channel.wait_for_state_change(state), remaining)
        state = channel.get_state(try_to_connect=True)


class Refused(Exception):
    """The control plane answered Register with a refusal; ``leader``: the address it names instead ("" none)."""

    def __init__(self, reason: str, *, leader: str = "", standby: bool = False, rejoin: bool = False) -> None:
        super().__init__(reason)
        self.leader = leader
        #: A standby of a live cluster answered (it named a leader or listed the control planes).
        self.standby = standby
        #: The certificate is refused for good (revoked, unknown): only a new join lets the node in.
        self.rejoin = rejoin


class Commands:
    """What the session needs from the rest of the agent; ``main`` wires the supervisor and logs in."""

    def __init__(self, *, start: Callable[[ShardSpec], Awaitable[object]],
                 stop: Callable[[str, str], Awaitable[object]], drain: Callable[[str, float], Awaitable[object]],
                 statuses: Callable[[], list[ShardStatus]],
                 logs: Callable[[str, int, bool], AsyncIterator[list[str]]],
                 remove_weights: Callable[[str], Awaitable[None]] | None = None,
                 fabric_test: Callable[[ft.FabricTestRequest], Awaitable[ft.FabricTestResult]] | None = None,
                 provision: Callable[[prov.Provision], None] | None = None) -> None:
        self.start, self.stop, self.drain, self.statuses, self.logs = start, stop, drain, statuses, logs
        #: Takes the engines the control plane wants here (the installer's ``apply``); None: ignored, said once.
        self.provision = provision
        #: Removes fetched weights by cache name; raises LlmgwError with the refusal. None: refuses every one.
        self.remove_weights = remove_weights
        #: Runs this node's side of a fabric bandwidth test; None: every test is answered with a refusal.
        self.fabric_test = fabric_test


class Session:
    def __init__(self, cfg: AgentConfig, *, inventory: Callable[[], Inventory], heartbeat: Callable[[], Heartbeat],
                 on_register: Callable[[Inventory], None], commands: Commands, agent_version: str) -> None:
        self.cfg, self._inventory, self._heartbeat, self._commands = cfg, inventory, heartbeat, commands
        self._on_register = on_register
        self._agent_version = agent_version
        self._out: asyncio.Queue[pb.AgentMessage] | None = None
        self._seq = itertools.count(1)
        self._tasks: set[asyncio.Task[object]] = set()
        self._log_tasks: dict[str, asyncio.Task[None]] = {}
        self.connected = asyncio.Event()
        #: A RenewCert is out and not yet answered (one at a time; a new stream may ask again).
        self._renewing = False
        #: Set by a round in which a standby answered: the next round comes soon, without the backoff.
        self._standby_answered = False
        #: The last round's refusal of the certificate for good ("": none), and how many rounds in a row had one.
        self._rejoin_reason, self._rejoin_rounds = "", 0
        #: Set by ``leave``: the agent is stopping, so starts are refused (and the control plane was told).
        self.leaving = ""
        #: The newest leader term seen (Register's answer, every command); kept across streams, so a
        #: deposed leader's command is refused whichever connection it arrives on. 0: none seen yet.
        self.term = 0
        self._stale_logged: set[int] = set()
        #: Control planes learned from Registers' answers (and the last run's file), after ``cfg.servers``.
        known = read_controlplanes(cfg.state_dir)
        self._learned = [a for a in known if a not in cfg.servers]
        #: What the file holds now: the same list from the next Register is not written again.
        self._stored = tuple(known)
        if self._learned:
            log.info("control planes known from the last run: %s", ", ".join(self._learned))

    @property
    def servers(self) -> tuple[str, ...]:
        """The rotation: the configured addresses, then those the control planes named."""
        return self.cfg.servers + tuple(self._learned)

    def report(self, status: ShardStatus) -> None:
        """Sends a shard's status now if connected; otherwise the next Register carries it."""
        if self._out is not None:
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), shard_status=convert.status_to_pb(status)))

    def leave(self, reason: str) -> None:
        """Tells the control plane this agent is stopping (before it stops anything); every start is refused from now.

        Seen with `make up` and two replicas: as the agent stopped its shards, the control plane at once
        started the stopped replica again on this same node, the agent launched it after its stop sweep,
        and exited, leaving an engine running for good.
        """
        self.leaving = reason
        if self._out is not None:
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), goodbye=pb.Goodbye(reason=reason)))

    def refuse_start(self, spec: ShardSpec, *, seq: int = 0) -> None:
        """Refuses a start while leaving: the Ack (for command ``seq``; 0: none) says why, and the shard is
        reported Stopped, so the control plane places it elsewhere instead of waiting for it here."""
        error = (f"refused to start shard {spec.shard_id}: this agent is stopping ({self.leaving}); the control plane "
                 "places it on another node")
        log.warning("%s", error)
        if self._out is not None:
            if seq:
                self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), ack=pb.Ack(seq=seq, ok=False, error=error)))
            stopped = ShardStatus(spec.shard_id, spec.replica_id, ShardState.STOPPED, message=error)
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), shard_status=convert.status_to_pb(stopped)))

    async def flush(self, *, timeout: float) -> None:
        """Waits (up to ``timeout``) until everything queued for the control plane was written."""
        out = self._out
        if out is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(out.join(), timeout)

    async def run_forever(self) -> None:
        """Dials until cancelled; raises ``rejoin.CertificateRefused`` once the certificate is refused for good."""
        delay = self.cfg.reconnect_base_s
        while True:
            self._standby_answered, self._rejoin_reason = False, ""
            if await self._round():
                delay, self._rejoin_rounds = self.cfg.reconnect_base_s, 0  # a clean close: reconnect at once
                continue
            self._rejoin_rounds = self._rejoin_rounds + 1 if self._rejoin_reason else 0
            if self._rejoin_rounds >= rejoin.ROUNDS:
                raise rejoin.refused(node_id=self.cfg.node_id, state_dir=self.cfg.state_dir,
                                     reason=self._rejoin_reason, rounds=self._rejoin_rounds)
            if self._standby_answered:
                # A failover is under way: a standby answers and takes the lease within the lease's length.
                # A backoff grown while the dead leader's lease ran out (4-8 s by then) would keep this
                # node away that much longer after the standby leads; a short steady retry finds it at once.
                await asyncio.sleep(STANDBY_RETRY_S / 2 + random.random() * STANDBY_RETRY_S / 2)
                continue
            # Jitter, so a fleet does not reconnect in lockstep.
            await asyncio.sleep(delay / 2 + random.random() * delay / 2)
            delay = min(delay * 2, self.cfg.reconnect_max_s)

    async def _round(self) -> bool:
        """Tries each address once (a named leader first); True when a stream closed cleanly."""
        queue = list(self.servers)
        # Leaders dialled on a standby's word this round. One that refuses too is not followed further:
        # two standbys naming each other (each with a stale idea of the leader) would otherwise ping-pong
        # without the backoff, hammering both.
        followed: set[str] = set()
        tried: set[str] = set()
        while queue:
            addr = queue.pop(0)
            tried.add(addr)
            try:
                await self._run_once(addr)
                return True
            except Refused as e:
                if e.rejoin:
                    self._rejoin_reason = str(e)
                    log.error("control plane %s refused this node's certificate (try %d of %d before the agent "
                              "stops): %s", addr, self._rejoin_rounds + 1, rejoin.ROUNDS, e)
                    continue
                log.warning("control plane %s refused this agent: %s", addr, e)
                self._standby_answered |= e.standby
                leader = e.leader
                if not leader or leader == addr or addr in followed or leader in followed:
                    continue
                if control_addr(leader) is None:
                    log.warning("control plane %s names %.80r as the leader, which is not HOST:PORT; going on "
                                "with the next address", addr, leader)
                    continue
                followed.add(leader)
                queue = [leader] + [a for a in queue if a != leader]
                log.info("control plane %s is a standby and names %s as the leader; dialling it now", addr, leader)
            # LlmgwError: this node's certificates could not be read (the message says what to do).
            except (grpc.aio.AioRpcError, OSError, TimeoutError, LlmgwError) as e:
                detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
                log.warning("control plane %s: %s", addr, detail or type(e).__name__)
                if self.cfg.tls is not None and (expired := self.cfg.tls.expiry_problem()):
                    log.error("%s", expired)
            finally:
                # Those the stream just named come in this round: an agent configured with the leader
                # alone, which died, must not wait out a backoff before trying the standbys it learned.
                queue += [a for a in self.servers if a not in tried and a not in queue]
        return False

    def _channel(self, addr: str) -> grpc.aio.Channel:
        if self.cfg.tls is None:
            return grpc.aio.insecure_channel(addr, options=CHANNEL_OPTIONS)
        ca, cert, key = self.cfg.tls.credentials()
        # root_certificates is the cluster CA alone: None would have gRPC trust the system's store.
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        return grpc.aio.secure_channel(addr, creds, options=CHANNEL_OPTIONS)

    async def _run_once(self, addr: str) -> None:
        async with self._channel(addr) as channel:
            await _connect(channel)
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            out: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
            inventory = await asyncio.to_thread(self._inventory)
            reg = self._register(inventory)
            # A new stream resends everything: heartbeat deltas start from what this Register says.
            self._on_register(inventory)
            first = await asyncio.wait_for(self._handshake(call, reg), REGISTER_TIMEOUT_S)
            if first is grpc.aio.EOF:
                raise Refused("the stream closed before Register was answered")
            self._see_term(max(first.term, first.ack.term))
            if first.WhichOneof("body") != "ack" or not first.ack.ok:
                if first.ack.controlplanes:
                    self._learn(first.ack.controlplanes, addr)  # a standby's list: the cluster's other members
                raise Refused(first.ack.error or "no reason given", leader=first.ack.leader,
                              standby=bool(first.ack.leader or first.ack.controlplanes), rejoin=first.ack.rejoin)
            self._learn(first.ack.controlplanes, addr)
            log.info("registered with %s as %s (%d shards)", addr, self.cfg.node_id, len(reg.register.shards))
            self._out = out
            self._renewing = False  # an answer the last stream never got must not block renewal for good
            self.connected.set()
            writer = asyncio.create_task(self._write(call, out))
            beat = asyncio.create_task(self._heartbeats(out))
            try:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        log.info("control plane %s closed the stream; reconnecting", addr)
                        return
                    self._handle(msg)
            finally:
                self._out = None
                self.connected.clear()
                writer.cancel()
                beat.cancel()
                for task in self._log_tasks.values():
                    task.cancel()
                self._log_tasks.clear()
                call.cancel()

    def _see_term(self, term: int) -> None:
        if term > self.term:
            if self.term:
                log.info("a control plane leads under term %d now (was %d)", term, self.term)
            self.term = term

    def _stale(self, msg: pb.ControlMessage, kind: str) -> bool:
        """Whether ``msg`` comes from a deposed leader (refused, answered, logged once per term)."""
        if not msg.term or msg.term >= self.term:
            return False  # 0: a control plane too old to send its term; acting on it is all it knows
        error = (f"refused {kind}: its term {msg.term} is older than term {self.term}, the newest this agent has "
                 f"seen (a newer control plane leads; this one was deposed and should step down); ignored")
        if msg.term not in self._stale_logged:
            self._stale_logged.add(msg.term)
            log.warning("%s (said once for term %d)", error, msg.term)
        if self._out is not None:
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), ack=pb.Ack(seq=msg.seq, ok=False, error=error)))
        return True

    def _learn(self, listed: Iterable[str], addr: str) -> None:
        """Adds the control planes an accepted Register lists to the rotation, and stores them for the next run."""
        addrs = _valid(listed, f"control plane {addr}")[:MAX_LEARNED]
        if not addrs:
            return  # an older control plane, which lists none: what we know stays
        new = [a for a in addrs if a not in self.cfg.servers and a not in self._learned]
        if new:
            self._learned = (self._learned + new)[-MAX_LEARNED:]
            log.info("control plane %s lists control planes this agent did not know: %s; added to its rotation",
                     addr, ", ".join(new))
        if tuple(addrs) == self._stored:
            return
        try:
            write_controlplanes(self.cfg.state_dir, addrs)
            self._stored = tuple(addrs)
        except OSError as e:
            log.warning("cannot store the control planes' addresses in %s (%s); a restarted agent knows only "
                        "its configured servers", self.cfg.state_dir / CONTROLPLANES_FILE, e.strerror or e)

    async def _handshake(self, call: grpc.aio.StreamStreamCall, reg: pb.AgentMessage) -> object:
        await call.write(reg)
        return await call.read()

    def _register(self, inventory: Inventory) -> pb.AgentMessage:
        return pb.AgentMessage(seq=next(self._seq), register=pb.Register(
            node_id=self.cfg.node_id, hostname=self.cfg.node_id, agent_version=self._agent_version,
            mgmt_addr=self.cfg.mgmt_addr, labels=dict(self.cfg.labels),
            shards=[convert.status_to_pb(s) for s in self._commands.statuses()],
            **convert.register_fields(inventory)))  # type: ignore[arg-type]

    async def _write(self, call: grpc.aio.StreamStreamCall, out: asyncio.Queue[pb.AgentMessage]) -> None:
        # One writer: grpc.aio allows only one write in flight per call.
        while True:
            msg = await out.get()
            try:
                await call.write(msg)
            finally:
                out.task_done()

    async def _heartbeats(self, out: asyncio.Queue[pb.AgentMessage]) -> None:
        while True:
            await asyncio.sleep(self.cfg.heartbeat_interval_s)
            hb = await asyncio.to_thread(self._heartbeat)
            out.put_nowait(pb.AgentMessage(seq=next(self._seq), heartbeat=convert.heartbeat_to_pb(hb)))
            self._maybe_renew(out)

    def _maybe_renew(self, out: asyncio.Queue[pb.AgentMessage]) -> None:
        tls = self.cfg.tls
        if tls is None or self._renewing:
            return
        try:
            if not tls.renew_due():
                return
            csr = pki.create_csr(self.cfg.node_id, tls.private_key())
        except LlmgwError as e:
            log.warning("cannot renew this node's certificate: %s", e)
            return
        self._renewing = True
        log.info("this node's certificate is in the last third of its life; asking the control plane for a new one")
        out.put_nowait(pb.AgentMessage(seq=next(self._seq), renew_cert=pb.RenewCert(csr_pem=csr)))

    def _renewed(self, issued: pb.CertIssued) -> None:
        self._renewing = False
        if issued.error or self.cfg.tls is None:
            log.warning("the control plane did not renew this node's certificate: %s; asking again at the next "
                        "heartbeat", issued.error or "it sent no certificate")
            return
        try:
            if pki.common_name(issued.cert_pem) != self.cfg.node_id:
                raise LlmgwError(f"it names node {pki.common_name(issued.cert_pem)!r}, not {self.cfg.node_id!r}")
            self.cfg.tls.replace_cert(issued.cert_pem)
        except (LlmgwError, OSError) as e:
            log.warning("the renewed certificate was not stored: %s; the old one stays", e)
            return
        log.info("renewed this node's certificate (valid until %s); the next connection uses it",
                 pki.load_cert(issued.cert_pem).not_valid_after_utc.isoformat())

    def _handle(self, msg: pb.ControlMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind in FENCED and self._stale(msg, kind):
            return
        self._see_term(msg.term)
        if kind == "start_shard":
            spec = convert.spec_from_pb(msg.start_shard.spec)
            if self.leaving:
                self.refuse_start(spec, seq=msg.seq)
                return
            log.info("command from the control plane (term %d): start shard %s", msg.term, spec.shard_id)
            self._spawn(self._commands.start(spec), f"start {spec.shard_id}")
        elif kind == "stop_shard":
            stop = msg.stop_shard
            log.info("command from the control plane (term %d): stop shard %s (%s)", msg.term, stop.shard_id,
                     stop.reason)
            self._spawn(self._commands.stop(stop.shard_id, stop.reason), f"stop {stop.shard_id}")
        elif kind == "controlplanes":
            self._learn(msg.controlplanes.addrs, "the leader")
            return
        elif kind == "drain":
            drain = msg.drain
            log.info("command from the control plane (term %d): drain shard %s", msg.term, drain.shard_id)
            self._spawn(self._commands.drain(drain.shard_id, float(drain.timeout_s or 30)), f"drain {drain.shard_id}")
        elif kind == "logs_request":
            req = msg.logs_request
            if req.request_id not in self._log_tasks:
                task = asyncio.create_task(self._send_logs(req))
                self._log_tasks[req.request_id] = task
                task.add_done_callback(lambda _t, rid=req.request_id: self._log_tasks.pop(rid, None))
            return
        elif kind == "logs_cancel":
            task = self._log_tasks.pop(msg.logs_cancel.request_id, None)
            if task is not None:
                task.cancel()
            return
        elif kind == "remove_weights":
            # Answered when done, with the refusal in the Ack: the control plane's
            # garbage collection must know a removal was refused, not assume it happened.
            name = msg.remove_weights.cache_name
            self._spawn(self._remove_weights(msg.seq, name), f"remove weights {name}")
            return
        elif kind == "ack":
            return
        elif kind == "cert_issued":
            self._renewed(msg.cert_issued)
            return
        elif kind == "provision":
            # The whole set of wanted engines, applied at once (the installer works in the background and
            # reports on heartbeats); no Ack: the control plane resends it on every Register.
            if self._commands.provision is None:
                log.warning("the control plane asks for engine installs, and this agent has no installer")
            else:
                self._commands.provision(convert.provision_from_pb(msg.provision))
            return
        elif kind == "fabric_test":
            # Answered by a FabricTestResult when the tool is done (seconds to minutes), not by an Ack.
            req = convert.fabric_test_from_pb(msg.fabric_test)
            self._spawn(self._fabric_test(req), f"fabric test {req.test_id}")
            return
        else:
            log.warning("ignoring a command this agent does not know (%s); is the control plane newer?", kind)
            return
        if self._out is not None:
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), ack=pb.Ack(seq=msg.seq, ok=True)))

    async def _remove_weights(self, seq: int, name: str) -> None:
        error = ""
        try:
            if self._commands.remove_weights is None:
                raise LlmgwError(f"cannot remove {name!r}: this agent has no weights cache")
            await self._commands.remove_weights(name)
            log.info("removed weights %s from the weights cache, as the control plane asked", name)
        except LlmgwError as e:
            # The fetcher logged the refusal (a path outside the cache, weights llmgw did not fetch).
            error = str(e)
        except Exception as e:
            log.exception("removing weights %s failed", name)
            error = f"removing {name!r} failed: {type(e).__name__}: {e}; see the agent's log"
        if self._out is not None:
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), ack=pb.Ack(seq=seq, ok=not error, error=error)))

    async def _fabric_test(self, req: ft.FabricTestRequest) -> None:
        if self._commands.fabric_test is None:
            result = ft.FabricTestResult(req.test_id, req.role, False, error="this agent runs no fabric tests")
        else:
            result = await self._commands.fabric_test(req)
        if self._out is not None:
            self._out.put_nowait(pb.AgentMessage(seq=next(self._seq),
                                                 fabric_result=convert.fabric_result_to_pb(result)))

    async def _send_logs(self, req: pb.LogsRequest) -> None:
        def reply(**kw: object) -> None:
            if self._out is not None:
                self._out.put_nowait(pb.AgentMessage(seq=next(self._seq), logs_reply=pb.LogsReply(
                    request_id=req.request_id, **kw)))  # type: ignore[arg-type]

        try:
            async for batch in self._commands.logs(req.shard_id, req.lines, req.follow):
                reply(lines=batch)
            reply(done=True)
        except asyncio.CancelledError:
            raise
        except (LookupError, LlmgwError) as e:
            # A refusal (no such shard, an id that is no shard id): its message says why, no traceback.
            reply(error=str(e.args[0]) if e.args else str(e), done=True)
        except Exception as e:  # the reader's own failure, said to whoever asked
            log.exception("reading logs for %s failed", req.shard_id or "the agent")
            reply(error=f"reading the log failed: {e}", done=True)

    def _spawn(self, coro: Awaitable[object], what: str) -> None:
        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("%s failed", what)

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
