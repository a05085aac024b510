"""What the agent does with each message the control plane sends: a table of kind -> handler.

Protobuf stops here: commands become core types before the supervisor sees them. ``HANDLERS`` names a
handler for every kind of ``ControlMessage.body`` this agent acts on, and ``NOT_HANDLED`` the kinds it
ignores on purpose, with why; a test checks that the two together are the oneof's kinds, so a kind added to
``agent.proto`` without a handler here fails it instead of being ignored. A kind this agent does not know
(a newer control plane's) is logged and ignored, as proto3 means it to be.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from llmgw.agent.session.addresses import Rotation
from llmgw.agent.session.enginecert import EngineCertRenewal
from llmgw.agent.session.fencing import FENCED, Fence
from llmgw.agent.session.heartbeats import Renewal
from llmgw.agent.session.outbox import Outbox
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core import agentupgrade as upg
from llmgw.core import fabrictest as ft
from llmgw.core import provision as prov
from llmgw.core.errors import LlmgwError
from llmgw.core.shards import ShardSpec, ShardState, ShardStatus

log = logging.getLogger(__name__)


class Commands:
    """What the session needs from the rest of the agent; ``main`` wires the supervisor and logs in."""

    def __init__(self, *, start: Callable[[ShardSpec], Awaitable[object]],
                 stop: Callable[[str, str], Awaitable[object]], drain: Callable[[str, float], Awaitable[object]],
                 statuses: Callable[[], list[ShardStatus]],
                 logs: Callable[[str, int, bool], AsyncIterator[list[str]]],
                 remove_weights: Callable[[str], Awaitable[None]] | None = None,
                 fabric_test: Callable[[ft.FabricTestRequest], Awaitable[ft.FabricTestResult]] | None = None,
                 provision: Callable[[prov.Provision], None] | None = None,
                 upgrade: Callable[[upg.UpgradeRequest, Callable[[upg.UpgradeStatus], None]], None] | None = None,
                 sleep: Callable[[str, int], Awaitable[object]] | None = None,
                 tunnel: Callable[[str, int], None] | None = None,
                 ) -> None:
        self.start, self.stop, self.drain, self.statuses, self.logs = start, stop, drain, statuses, logs
        #: Takes the engines the control plane wants here (the installer's ``apply``); None: ignored, said once.
        self.provision = provision
        #: Removes fetched weights by cache name; raises LlmgwError with the refusal. None: refuses every one.
        self.remove_weights = remove_weights
        #: Runs this node's side of a fabric bandwidth test; None: every test is answered with a refusal.
        self.fabric_test = fabric_test
        #: Starts this agent's upgrade (``selfupgrade.SelfUpgrade.begin``), which reports through the callable it
        #: is given; None: every upgrade is answered FAILED.
        self.upgrade = upgrade
        #: Puts a shard's engine to sleep (level 1, 2) or wakes it (0); None: every sleep is ignored, said once.
        self.sleep = sleep
        #: Dials (or keeps) the engine tunnel to HOST, PORT (``agent.tunnel``); None: offers are ignored, said once.
        self.tunnel = tunnel


class Handlers:
    """Carries out the control plane's messages; each handler returns whether an Ack(ok) answers it now."""

    def __init__(self, commands: Commands, outbox: Outbox, *, fence: Fence, rotation: Rotation,
                 renewal: Renewal, engine_cert: EngineCertRenewal | None = None) -> None:
        self.commands, self.outbox, self.fence = commands, outbox, fence
        self._rotation, self._renewal, self._engine_cert = rotation, renewal, engine_cert
        self._tasks: set[asyncio.Task[object]] = set()
        #: The log requests being answered, by request id; cancelled when their stream ends.
        self.log_tasks: dict[str, asyncio.Task[None]] = {}
        #: Set by ``leave``: the agent is stopping, so starts are refused (and the control plane was told).
        self.leaving = ""
        #: An upgrade's status said while no stream was up: sent on the next stream, with its first message's
        #: handling (the Provision every Register is answered with), so a FAILED is never lost to a reconnect.
        self._upgrade_unsent: upg.UpgradeStatus | None = None

    def dispatch(self, msg: pb.ControlMessage) -> None:
        if self._upgrade_unsent is not None and self.outbox.queue is not None:
            unsent, self._upgrade_unsent = self._upgrade_unsent, None
            self._upgrade_status(unsent)
        kind = msg.WhichOneof("body")
        if kind in FENCED and self.fence.stale(msg, kind, self.outbox):
            return
        self.fence.see(msg.term)
        handler = HANDLERS.get(kind or "")
        if handler is None:
            if kind not in NOT_HANDLED:
                log.warning("ignoring a command this agent does not know (%s); is the control plane newer?", kind)
            return
        if handler(self, msg):
            self.outbox.ack(msg.seq)

    def refuse_start(self, spec: ShardSpec, *, seq: int = 0) -> None:
        """Refuses a start while leaving: the Ack (for command ``seq``; 0: none) says why, and the shard is
        reported Stopped, so the control plane places it elsewhere instead of waiting for it here."""
        error = (f"refused to start shard {spec.shard_id}: this agent is stopping ({self.leaving}); the control plane "
                 "places it on another node")
        log.warning("%s", error)
        if self.outbox.queue is not None:
            if seq:
                self.outbox.ack(seq, error=error)
            stopped = ShardStatus(spec.shard_id, spec.replica_id, ShardState.STOPPED, message=error)
            self.outbox.send(shard_status=convert.status_to_pb(stopped))

    def end_stream(self) -> None:
        """The stream ended: the log requests it carried are answered to no one, so they stop."""
        for task in self.log_tasks.values():
            task.cancel()
        self.log_tasks.clear()

    def start_shard(self, msg: pb.ControlMessage) -> bool:
        spec = convert.spec_from_pb(msg.start_shard.spec)
        if self.leaving:
            self.refuse_start(spec, seq=msg.seq)
            return False
        log.info("command from the control plane (term %d): start shard %s", msg.term, spec.shard_id)
        self._spawn(self.commands.start(spec), f"start {spec.shard_id}")
        return True

    def stop_shard(self, msg: pb.ControlMessage) -> bool:
        stop = msg.stop_shard
        log.info("command from the control plane (term %d): stop shard %s (%s)", msg.term, stop.shard_id, stop.reason)
        self._spawn(self.commands.stop(stop.shard_id, stop.reason), f"stop {stop.shard_id}")
        return True

    def drain(self, msg: pb.ControlMessage) -> bool:
        drain = msg.drain
        log.info("command from the control plane (term %d): drain shard %s", msg.term, drain.shard_id)
        self._spawn(self.commands.drain(drain.shard_id, float(drain.timeout_s or 30)), f"drain {drain.shard_id}")
        return True

    def sleep_shard(self, msg: pb.ControlMessage) -> bool:
        cmd = msg.sleep_shard
        verb = f"put shard {cmd.shard_id} to sleep at level {cmd.level}" if cmd.level else f"wake shard {cmd.shard_id}"
        log.info("command from the control plane (term %d): %s", msg.term, verb)
        if self.commands.sleep is None:
            log.warning("the control plane asks to %s, and this agent cannot", verb)
            return True
        self._spawn(self.commands.sleep(cmd.shard_id, min(int(cmd.level), 2)), verb)
        return True

    def controlplanes(self, msg: pb.ControlMessage) -> bool:
        self._rotation.learn(msg.controlplanes.addrs, "the leader")
        return False

    def logs_request(self, msg: pb.ControlMessage) -> bool:
        req = msg.logs_request
        if req.request_id not in self.log_tasks:
            task = asyncio.create_task(self._send_logs(req))
            self.log_tasks[req.request_id] = task
            task.add_done_callback(lambda _t, rid=req.request_id: self.log_tasks.pop(rid, None))
        return False

    def logs_cancel(self, msg: pb.ControlMessage) -> bool:
        task = self.log_tasks.pop(msg.logs_cancel.request_id, None)
        if task is not None:
            task.cancel()
        return False

    def remove_weights(self, msg: pb.ControlMessage) -> bool:
        # Answered when done, with the refusal in the Ack: the control plane's
        # garbage collection must know a removal was refused, not assume it happened.
        name = msg.remove_weights.cache_name
        self._spawn(self._remove_weights(msg.seq, name), f"remove weights {name}")
        return False

    def cert_issued(self, msg: pb.ControlMessage) -> bool:
        if msg.cert_issued.purpose == pb.CERT_PURPOSE_ENGINE:
            if self._engine_cert is not None:
                self._engine_cert.issued(msg.cert_issued)
        else:
            self._renewal.issued(msg.cert_issued)
        return False

    def provision(self, msg: pb.ControlMessage) -> bool:
        # The whole set of wanted engines, applied at once (the installer works in the background and
        # reports on heartbeats); no Ack: the control plane resends it on every Register.
        if self.commands.provision is None:
            log.warning("the control plane asks for engine installs, and this agent has no installer")
        else:
            self.commands.provision(convert.provision_from_pb(msg.provision))
        return False

    def fabric_test(self, msg: pb.ControlMessage) -> bool:
        # Answered by a FabricTestResult when the tool is done (seconds to minutes), not by an Ack.
        req = convert.fabric_test_from_pb(msg.fabric_test)
        self._spawn(self._fabric_test(req), f"fabric test {req.test_id}")
        return False

    def upgrade_agent(self, msg: pb.ControlMessage) -> bool:
        # Answered by UpgradeStatus messages (installing, restarting, failed), not by an Ack.
        m = msg.upgrade_agent
        req = upg.UpgradeRequest(m.id, m.version, m.index_url, m.find_links)
        log.info("command from the control plane (term %d): upgrade this agent to llmgw %.80r", msg.term, m.version)
        if self.commands.upgrade is None:
            self._upgrade_status(upg.UpgradeStatus(req.id, req.version, upg.State.FAILED,
                                                   "this agent cannot upgrade itself"))
        else:
            self.commands.upgrade(req, self._upgrade_status)
        return False

    def _upgrade_status(self, st: upg.UpgradeStatus) -> None:
        if self.outbox.queue is None:
            self._upgrade_unsent = st  # the last one is what the control plane needs
            return
        self.outbox.send(upgrade_status=pb.UpgradeStatus(
            id=st.id, version=st.version, state=_UPGRADE_STATES[st.state], message=st.message,
            last_output=list(st.last_output)))

    async def _remove_weights(self, seq: int, name: str) -> None:
        error = ""
        try:
            if self.commands.remove_weights is None:
                raise LlmgwError(f"cannot remove {name!r}: this agent has no weights cache")
            await self.commands.remove_weights(name)
            log.info("removed weights %s from the weights cache, as the control plane asked", name)
        except LlmgwError as e:
            # The fetcher logged the refusal (a path outside the cache, weights llmgw did not fetch).
            error = str(e)
        except Exception as e:
            log.exception("removing weights %s failed", name)
            error = f"removing {name!r} failed: {type(e).__name__}: {e}; see the agent's log"
        self.outbox.ack(seq, error=error)

    async def _fabric_test(self, req: ft.FabricTestRequest) -> None:
        if self.commands.fabric_test is None:
            result = ft.FabricTestResult(req.test_id, req.role, False, error="this agent runs no fabric tests")
        else:
            result = await self.commands.fabric_test(req)
        self.outbox.send(fabric_result=convert.fabric_result_to_pb(result))

    async def _send_logs(self, req: pb.LogsRequest) -> None:
        def reply(**kw: object) -> None:
            self.outbox.send(logs_reply=pb.LogsReply(request_id=req.request_id, **kw))  # type: ignore[arg-type]

        try:
            async for batch in self.commands.logs(req.shard_id, req.lines, req.follow):
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


def _tunnel_offer(handlers: Handlers, msg: pb.ControlMessage) -> bool:
    """Issue 33: dial the control plane's tunnel port, on the host this stream registered with."""
    addr = handlers._rotation.current
    host = addr.rpartition(":")[0].strip("[]")
    if handlers.commands.tunnel is None or not host:
        log.warning("the control plane offers an engine tunnel (port %d), and this agent has none to dial (its "
                    "engine_access is direct?); its engines are reached directly", msg.tunnel_offer.port)
        return False
    handlers.commands.tunnel(host, msg.tunnel_offer.port)
    return False


Handler = Callable[[Handlers, pb.ControlMessage], bool]

_UPGRADE_STATES = {upg.State.INSTALLING: pb.UPGRADE_INSTALLING, upg.State.RESTARTING: pb.UPGRADE_RESTARTING,
                   upg.State.FAILED: pb.UPGRADE_FAILED}

#: Every kind of ``ControlMessage.body`` this agent acts on, and what it does with it.
HANDLERS: dict[str, Handler] = {
    "start_shard": Handlers.start_shard,
    "stop_shard": Handlers.stop_shard,
    "drain": Handlers.drain,
    "logs_request": Handlers.logs_request,
    "logs_cancel": Handlers.logs_cancel,
    "remove_weights": Handlers.remove_weights,
    "cert_issued": Handlers.cert_issued,
    "provision": Handlers.provision,
    "fabric_test": Handlers.fabric_test,
    "controlplanes": Handlers.controlplanes,
    "upgrade_agent": Handlers.upgrade_agent,
    "sleep_shard": Handlers.sleep_shard,
    "tunnel_offer": _tunnel_offer,
}
#: The kinds this agent receives and ignores on purpose, with why.
NOT_HANDLED: dict[str, str] = {
    "ack": "the control plane acks only the Register, and the stream reads that answer itself before it "
           "dispatches anything; an Ack afterwards asks nothing of the agent",
}
