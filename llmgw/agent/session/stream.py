"""The agent's stream to the control plane: register, keep the stream, reconnect forever.

The agent always dials; a control plane restart or a partition must never need anyone to touch a node, so
it reconnects forever. Addresses are tried in order and a failure moves to the next at once; the jittered,
capped backoff applies only after a whole round failed (the next address has not been hammered, and a fleet
reconnecting in lockstep knocks a restarted control plane over again).

With several control planes (one leader, standbys), a standby refuses Register and names the leader: the
agent dials that address next, at once, whatever its place in the rotation. What arrives on the stream is
carried out by ``handlers``; heartbeats and the certificate's renewal go out from ``heartbeats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

import grpc

from llmgw.agent import rejoin
from llmgw.agent.config import AgentConfig
from llmgw.agent.enginetls import EngineTls
from llmgw.agent.session import dial, heartbeats
from llmgw.agent.session.addresses import Rotation, control_addr
from llmgw.agent.session.enginecert import EngineCertRenewal
from llmgw.agent.session.fencing import Fence
from llmgw.agent.session.handlers import Commands, Handlers
from llmgw.agent.session.outbox import Outbox
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Heartbeat, Inventory
from llmgw.core.shards import ShardSpec, ShardStatus

log = logging.getLogger(__name__)

#: Between rounds while a standby answers (a failover under way), instead of the growing backoff.
STANDBY_RETRY_S = 1.0


class Session:
    """The agent's stream to the control plane: ``run_forever`` keeps one up; the agent reports through it."""

    def __init__(self, cfg: AgentConfig, *, inventory: Callable[[], Inventory], heartbeat: Callable[[], Heartbeat],
                 on_register: Callable[[Inventory], None], commands: Commands, agent_version: str,
                 engine_tls: EngineTls | None = None) -> None:
        self.cfg, self._inventory, self._heartbeat, self._commands = cfg, inventory, heartbeat, commands
        self._on_register = on_register
        self._agent_version = agent_version
        self.outbox = Outbox()
        self.connected = asyncio.Event()
        #: Set by a round in which a standby answered: the next round comes soon, without the backoff.
        self._standby_answered = False
        #: The last round's refusal of the certificate for good ("": none), and how many rounds in a row had one.
        self._rejoin_reason, self._rejoin_rounds = "", 0
        #: The skew refusals logged at ERROR in this outage: each is logged once until a stream runs (several
        #: control planes of other releases each say theirs once, not once a round).
        self._skew_told: set[str] = set()
        self._fence = Fence()
        self._rotation = Rotation(cfg.servers, cfg.state_dir)
        self._renewal = heartbeats.Renewal(cfg.node_id, cfg.tls)
        self._engine_cert = EngineCertRenewal(engine_tls)
        self._handlers = Handlers(commands, self.outbox, fence=self._fence, rotation=self._rotation,
                                  renewal=self._renewal, engine_cert=self._engine_cert)

    @property
    def servers(self) -> tuple[str, ...]:
        """The rotation: the configured addresses, then those the control planes named."""
        return self._rotation.servers

    @property
    def term(self) -> int:
        """The newest leader term seen; a command from an older one is refused (``fencing``). 0: none yet."""
        return self._fence.term

    @property
    def leaving(self) -> str:
        """Why the agent is stopping, once ``leave`` was called ("" until then): starts are refused."""
        return self._handlers.leaving

    def report(self, status: ShardStatus) -> None:
        """Sends a shard's status now if connected; otherwise the next Register carries it."""
        self.outbox.send(shard_status=convert.status_to_pb(status))

    def leave(self, reason: str) -> None:
        """Tells the control plane this agent is stopping (before it stops anything); every start is refused from now.

        Seen with `make up` and two replicas: as the agent stopped its shards, the control plane at once
        started the stopped replica again on this same node, the agent launched it after its stop sweep,
        and exited, leaving an engine running for good.
        """
        self._handlers.leaving = reason
        self.outbox.send(goodbye=pb.Goodbye(reason=reason))

    def refuse_start(self, spec: ShardSpec, *, seq: int = 0) -> None:
        """Refuses a start while leaving (``Handlers.refuse_start``)."""
        self._handlers.refuse_start(spec, seq=seq)

    async def flush(self, *, timeout: float) -> None:
        """Waits (up to ``timeout``) until everything queued for the control plane was written."""
        out = self.outbox.queue
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
            except dial.Refused as e:
                if e.skew:
                    self._tell_skew(addr, str(e))
                    continue
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

    def _tell_skew(self, addr: str, reason: str) -> None:
        """A skew refusal, logged at ERROR once per outage (it lasts until a control plane or this agent is
        upgraded; the agent dials on with its usual backoff meanwhile), at DEBUG on each retry."""
        if reason in self._skew_told:
            log.debug("control plane %s: still outside the skew policy: %s", addr, reason)
            return
        self._skew_told.add(reason)
        log.error("control plane %s and this agent do not work together: %s; dialling again with backoff until "
                  "one of them is upgraded", addr, reason)

    def _check_answer(self, ack: pb.Ack) -> str:
        """Why this agent will not run a session with the control plane that sent ``ack`` ("" when it will).

        The control plane refuses an agent it knows to be outside its policy; an older one cannot know of a
        newer agent (a 0.1.0 control plane sends no protocol), so the agent checks the answer itself."""
        return skew.server_refusal("agent", ack.protocol, ack.server_version, own_protocol=self.cfg.protocol,
                                   own_version=self._agent_version)

    async def _run_once(self, addr: str) -> None:
        async with dial.channel(addr, self.cfg.tls) as channel:
            await dial.connect(channel)
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            out: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
            inventory = await asyncio.to_thread(self._inventory)
            reg = self._register(inventory)
            # A new stream resends everything: heartbeat deltas start from what this Register says.
            self._on_register(inventory)
            first = await asyncio.wait_for(self._handshake(call, reg), dial.REGISTER_TIMEOUT_S)
            if first is grpc.aio.EOF:
                raise dial.Refused("the stream closed before Register was answered")
            self._fence.see(max(first.term, first.ack.term))
            if first.WhichOneof("body") != "ack" or not first.ack.ok:
                if first.ack.controlplanes:  # a standby's list: the cluster's other members
                    self._rotation.learn(first.ack.controlplanes, addr)
                # A control plane that says its protocol refused for the skew when its policy refuses this agent
                # (a standby naming the leader is followed whatever its release: the leader is what counts).
                skewed = bool(first.ack.protocol) and not first.ack.leader and bool(self._check_answer(first.ack))
                raise dial.Refused(first.ack.error or "no reason given", leader=first.ack.leader,
                                   standby=bool(first.ack.leader or first.ack.controlplanes), rejoin=first.ack.rejoin,
                                   skew=skewed)
            if refusal := self._check_answer(first.ack):
                # Accepted by a control plane too old to know of this agent: no session with it (its commands
                # and answers are an older wire's); closing the stream now leaves the node disconnected there.
                raise dial.Refused(refusal, skew=True)
            self._skew_told = set()
            self._rotation.learn(first.ack.controlplanes, addr)
            log.info("registered with %s as %s (%d shards)", addr, self.cfg.node_id, len(reg.register.shards))
            self.outbox.queue = out
            self._renewal.renewing = False  # an answer the last stream never got must not block renewal for good
            self._engine_cert.asking = False
            self.connected.set()
            writer = asyncio.create_task(self._write(call, out))
            # At registration: an engine started with TLS waits for this certificate.
            self._engine_cert.ask_if_due(self.outbox)
            beat = asyncio.create_task(heartbeats.beat(self.cfg.heartbeat_interval_s, self._heartbeat, self.outbox,
                                                       self._renewal, self._engine_cert))
            try:
                while True:
                    msg = await call.read()
                    if msg is grpc.aio.EOF:
                        log.info("control plane %s closed the stream; reconnecting", addr)
                        return
                    self._handle(msg)
            finally:
                self.outbox.queue = None
                self.connected.clear()
                writer.cancel()
                beat.cancel()
                self._handlers.end_stream()
                call.cancel()

    def _handle(self, msg: pb.ControlMessage) -> None:
        """Carries out one message from the control plane (``handlers.HANDLERS`` says how, by its kind)."""
        self._handlers.dispatch(msg)

    async def _handshake(self, call: grpc.aio.StreamStreamCall, reg: pb.AgentMessage) -> object:
        await call.write(reg)
        return await call.read()

    def _register(self, inventory: Inventory) -> pb.AgentMessage:
        return self.outbox.message(register=pb.Register(
            node_id=self.cfg.node_id, hostname=self.cfg.node_id, agent_version=self._agent_version,
            protocol=self.cfg.protocol, mgmt_addr=self.cfg.mgmt_addr, labels=dict(self.cfg.labels),
            engine_access=self.cfg.engine_access,
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
