"""The agent's side of the skew policy (``core.skew``), against real gRPC servers on 127.0.0.1 acting as control
planes of other releases: Register says this agent's protocol; an answer from a control plane too old for the
agent (0.1.0's: no protocol) runs no session, is logged at ERROR once however often the agent redials, and the
agent dials on; a control plane's own skew refusal is logged the same way; one inside the policy is served."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from llmgw.agent import session as session_mod
from llmgw.agent.config import AgentConfig
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.core.inventory import Inventory

GUARD_S = 30.0
#: Short, so that a test sees several rounds: the refusal must be logged once across them, not once each.
BACKOFF_S = 0.05


class _Control(agent_pb2_grpc.AgentServiceServicer):
    """A control plane of some release: answers every Register with ``ack`` (its protocol and version, or none).

    A synchronous gRPC server, on threads of its own: grpc.aio's server.stop, in the loop of the agent's streams,
    hung now and then as the agent's redial crossed it (and a second aio loop in the process breaks its poller)."""

    def __init__(self, ack: pb.Ack) -> None:
        self.ack = ack
        self.registers: list[pb.Register] = []
        self.more = threading.Event()  # set at the third Register
        self.after_ack: list[str] = []  # kinds of the messages an agent sent on an accepted stream

    def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        first = next(request_iterator)
        self.registers.append(first.register)
        if len(self.registers) >= 3:
            self.more.set()
        ack = pb.Ack()
        ack.CopyFrom(self.ack)
        ack.seq = first.seq
        yield pb.ControlMessage(ack=ack)
        if not ack.ok:
            return
        # An accepted stream: what the agent sends next is a session running (heartbeats, statuses).
        with contextlib.suppress(grpc.RpcError):
            for msg in request_iterator:
                self.after_ack.append(msg.WhichOneof("body") or "")


def _serve(stack: contextlib.AsyncExitStack, servicer: _Control) -> str:
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stack.callback(server.stop, 0)  # after the agent's task is cancelled (the stack unwinds in reverse)
    return f"127.0.0.1:{port}"


async def _nothing(*_a: object) -> None:
    return None


def _session(servers: Sequence[str], state_dir: Path, *, protocol: int = skew.PROTOCOL) -> session_mod.Session:
    cfg = AgentConfig(servers=tuple(servers), node_id="n1", mgmt_addr="127.0.0.1", state_dir=state_dir,
                      heartbeat_interval_s=0.05, reconnect_base_s=BACKOFF_S, reconnect_max_s=BACKOFF_S,
                      protocol=protocol)
    return session_mod.Session(
        cfg, inventory=lambda: Inventory(cpu_count=1, memory_total_bytes=1, memory_available_bytes=1),
        heartbeat=lambda: None,  # type: ignore[arg-type,return-value]
        on_register=lambda _i: None, agent_version="0.2.0",
        commands=session_mod.Commands(start=_nothing, stop=_nothing, drain=_nothing, statuses=list,
                                      logs=None))  # type: ignore[arg-type]


async def _run(stack: contextlib.AsyncExitStack, session: session_mod.Session) -> asyncio.Task[None]:
    task = asyncio.create_task(session.run_forever())

    async def cancel() -> None:
        # Cancelled again until it ends: on Python 3.11 ``asyncio.wait_for`` drops a cancellation that arrives as
        # its inner future completes (gh-86296), and with redials every 50 ms the handshake's wait_for is often
        # where it lands (the session then dialled on for good; serve.py's reconcile task does the same).
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.5)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(cancel)
    return task


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_register_says_the_agents_protocol(tmp_path: Path) -> None:
    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            cp = _Control(pb.Ack(ok=True, protocol=skew.PROTOCOL, server_version="0.2.0"))
            session = _session([_serve(stack, cp)], tmp_path)
            await _run(stack, session)
            await asyncio.wait_for(session.connected.wait(), GUARD_S)
            assert cp.registers[0].protocol == skew.PROTOCOL
            assert cp.registers[0].agent_version == "0.2.0"

    asyncio.run(main())


def test_a_control_plane_too_old_for_the_agent_is_refused_once_per_outage(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """0.1.0's control plane accepts this agent (it cannot know of protocols) and says no protocol: the agent runs
    no session with it (sends nothing after the Register), says why at ERROR once, and keeps dialling."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            old = _Control(pb.Ack(ok=True))  # what 0.1.0 answers: no protocol, no version
            session = _session([_serve(stack, old)], tmp_path)
            with caplog.at_level(logging.DEBUG, logger=session_mod.__name__):
                await _run(stack, session)
                assert await asyncio.to_thread(old.more.wait, GUARD_S)  # three Registers: it redials
            assert not session.connected.is_set()
            assert old.after_ack == []  # no heartbeat, no status: no session ran
            errors = _errors(caplog)
            assert len(errors) == 1, errors
            assert f"this agent 0.2.0 (protocol {skew.PROTOCOL}) is newer than the control plane of an unknown " \
                   "version (protocol 1)" in errors[0]
            assert "upgrade the control planes first" in errors[0]

    asyncio.run(main())


def test_the_control_planes_own_skew_refusal_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A control plane at protocol 2 refuses an agent at 4 (two releases ahead) with its sentence: logged at ERROR
    once over the rounds, and redialled (no rejoin, no giving up)."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            said = skew.peer_refusal("agent", 4, "0.4.0", server_version="0.2.0")
            cp = _Control(pb.Ack(ok=False, error=said, protocol=2, server_version="0.2.0"))
            session = _session([_serve(stack, cp)], tmp_path, protocol=4)
            with caplog.at_level(logging.DEBUG, logger=session_mod.__name__):
                task = await _run(stack, session)
                assert await asyncio.to_thread(cp.more.wait, GUARD_S)
            assert not task.done()
            assert [r.protocol for r in cp.registers[:3]] == [4, 4, 4]
            errors = _errors(caplog)
            assert len(errors) == 1 and said in errors[0], errors
            warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert not any(said in w for w in warned)  # not also once per retry at WARNING

    asyncio.run(main())


def test_a_control_plane_one_protocol_newer_serves_the_agent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The agent at protocol 1 (N-1) with a control plane at 2: inside the policy, the session runs."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            cp = _Control(pb.Ack(ok=True, protocol=2, server_version="0.2.0"))
            session = _session([_serve(stack, cp)], tmp_path, protocol=1)
            with caplog.at_level(logging.INFO, logger=session_mod.__name__):
                await _run(stack, session)
                await asyncio.wait_for(session.connected.wait(), GUARD_S)
            assert _errors(caplog) == []

    asyncio.run(main())


def test_two_control_planes_too_old_are_each_said_once_not_once_a_round(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Each address of the rotation refuses with a sentence of its own: each is logged once over the rounds."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            a = _Control(pb.Ack(ok=True))  # 0.1.0
            b = _Control(pb.Ack(ok=True, protocol=1, server_version="0.1.5"))
            session = _session([_serve(stack, a), _serve(stack, b)], tmp_path)
            with caplog.at_level(logging.DEBUG, logger=session_mod.__name__):
                await _run(stack, session)
                assert await asyncio.to_thread(a.more.wait, GUARD_S) and await asyncio.to_thread(b.more.wait, GUARD_S)
            errors = _errors(caplog)
            assert len(errors) == 2, errors
            assert "control plane of an unknown version (protocol 1)" in errors[0]
            assert "control plane 0.1.5 (protocol 1)" in errors[1]

    asyncio.run(main())
