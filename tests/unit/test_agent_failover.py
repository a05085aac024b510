"""The agent's side of several control planes, against real gRPC servers on 127.0.0.1: a standby's refusal naming
the leader is followed at once, commands from a deposed leader's older term are refused, and the control planes an
accepted Register lists are kept in the rotation and in ``controlplanes.json`` for the next run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from llmgw.agent import session as session_mod
from llmgw.agent.config import AgentConfig
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.api.v1 import agent_pb2_grpc
from llmgw.core import skew
from llmgw.core.inventory import Inventory

# Far longer than any test waits: an agent that backed off instead of dialling at once would hang the test here.
BACKOFF_S = 600.0
GUARD_S = 30.0


class _Control(agent_pb2_grpc.AgentServiceServicer):
    """A control plane: accepts (a leader) or refuses naming ``leader`` (a standby); sends ``commands``."""

    def __init__(self, *, ok: bool, term: int = 0, leader: str = "", controlplanes: Sequence[str] = ()) -> None:
        self.ok, self.term, self.leader, self.controlplanes = ok, term, leader, list(controlplanes)
        self.registers: list[str] = []
        self.commands: asyncio.Queue[pb.ControlMessage] = asyncio.Queue()
        self.acks: asyncio.Queue[pb.Ack] = asyncio.Queue()

    async def Connect(self, request_iterator, context):  # type: ignore[no-untyped-def]  # noqa: N802
        first = await anext(request_iterator)
        self.registers.append(first.register.node_id)
        yield pb.ControlMessage(ack=pb.Ack(seq=first.seq, ok=self.ok, protocol=skew.PROTOCOL, term=self.term,
                                           leader=self.leader,
                                           error="" if self.ok else "this control plane is a standby",
                                           controlplanes=self.controlplanes))
        if not self.ok:
            return
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            while True:
                yield await self.commands.get()
        finally:
            # Awaited, so that no read is left pending on the call when the server stops.
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, request_iterator: AsyncIterator[pb.AgentMessage]) -> None:
        async for msg in request_iterator:
            if msg.WhichOneof("body") == "ack":
                self.acks.put_nowait(msg.ack)


async def _serve(stack: contextlib.AsyncExitStack, servicer: _Control) -> str:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    # Stopped after the agent (the stack unwinds in reverse): grpc.aio's server.stop, called while a stream
    # of this same event loop was open, was seen to hang now and then.
    stack.push_async_callback(server.stop, 0)
    return f"127.0.0.1:{port}"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def _nothing(*_a: object) -> None:
    return None


def _session(servers: Sequence[str], state_dir: Path, *,
             stop: Callable[[str, str], Awaitable[object]] = _nothing) -> session_mod.Session:
    cfg = AgentConfig(servers=tuple(servers), node_id="n1", mgmt_addr="127.0.0.1", state_dir=state_dir,
                      heartbeat_interval_s=BACKOFF_S, reconnect_base_s=BACKOFF_S, reconnect_max_s=BACKOFF_S)
    return session_mod.Session(
        cfg, inventory=lambda: Inventory(cpu_count=1, memory_total_bytes=1, memory_available_bytes=1),
        heartbeat=lambda: None,  # type: ignore[arg-type,return-value]
        on_register=lambda _i: None, agent_version="test",
        commands=session_mod.Commands(start=_nothing, stop=stop, drain=_nothing, statuses=list,
                                      logs=None))  # type: ignore[arg-type]


async def _running(stack: contextlib.AsyncExitStack, session: session_mod.Session) -> None:
    """Runs ``session`` until the test ends, and waits until it registered."""
    task = asyncio.create_task(session.run_forever())

    async def cancel() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(cancel)
    await asyncio.wait_for(session.connected.wait(), GUARD_S)


@pytest.mark.parametrize("place", ["last", "first"])
def test_refusal_naming_the_leader_is_followed_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       place: str) -> None:
    """A standby refuses naming the leader; the agent registers there next, before the rest of its rotation
    (first) and without the backoff a finished round would cost (last: the standby is the only address)."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            leader, decoy = _Control(ok=True, term=7), _Control(ok=True, term=7)
            standby = _Control(ok=False, term=7, leader=await _serve(stack, leader))
            servers = [await _serve(stack, standby)] + ([await _serve(stack, decoy)] if place == "first" else [])
            session = _session(servers, tmp_path)
            with caplog.at_level(logging.INFO, logger=session_mod.__name__):
                await _running(stack, session)
            assert (standby.registers, leader.registers, decoy.registers) == (["n1"], ["n1"], [])
            assert session.term == 7
            named = [r.getMessage() for r in caplog.records if "names" in r.getMessage()]
            assert len(named) == 1 and standby.leader in named[0]

    asyncio.run(main())


def test_standbys_naming_each_other_do_not_ping_pong(tmp_path: Path) -> None:
    """Two standbys each naming the other as leader: each is dialled once this round, then the round fails."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            a, b = _Control(ok=False), _Control(ok=False)
            a_addr, b_addr = await _serve(stack, a), await _serve(stack, b)
            a.leader, b.leader = b_addr, a_addr
            session = _session([a_addr], tmp_path)
            assert await asyncio.wait_for(session._round(), GUARD_S) is False
            assert (a.registers, b.registers) == (["n1"], ["n1"])

    asyncio.run(main())


def test_commands_of_an_older_term_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After a Register answered under term 7, term 5 commands are refused (Ack names both); 7, 0 and 8 are done."""
    stopped: list[str] = []

    async def stop(shard_id: str, _reason: str) -> None:
        stopped.append(shard_id)

    async def main() -> dict[int, pb.Ack]:
        async with contextlib.AsyncExitStack() as stack:
            leader = _Control(ok=True, term=7)
            session = _session([await _serve(stack, leader)], tmp_path, stop=stop)
            await _running(stack, session)
            sent = [(11, 5, "old"), (12, 7, "same"), (13, 0, "unsaid"), (14, 5, "old-again"), (15, 8, "newer"),
                    (16, 7, "now-old")]
            with caplog.at_level(logging.WARNING, logger=session_mod.__name__):
                for seq, term, shard in sent:
                    leader.commands.put_nowait(pb.ControlMessage(seq=seq, term=term,
                                                                 stop_shard=pb.StopShard(shard_id=shard)))
                leader.commands.put_nowait(pb.ControlMessage(seq=17, term=5, drain=pb.Drain(shard_id="old-drain")))
                acks = {}
                while len(acks) < 7:
                    ack = await asyncio.wait_for(leader.acks.get(), GUARD_S)
                    acks[ack.seq] = ack
            assert session.term == 8
            return acks

    acks = asyncio.run(main())
    assert sorted(stopped) == ["newer", "same", "unsaid"]
    assert {seq for seq, a in acks.items() if a.ok} == {12, 13, 15}
    assert "term 5 is older than term 7" in acks[11].error and acks[11].error.endswith("; ignored")
    assert "term 7 is older than term 8" in acks[16].error and "term 5 is older" in acks[17].error
    said = [r.getMessage() for r in caplog.records if "older than" in r.getMessage()]
    assert len(said) == 2, said  # once for term 5 (three commands), once for term 7


def test_listed_controlplanes_are_kept_for_the_next_run(tmp_path: Path) -> None:
    """The Register's answer lists control planes: stored 0600, invalid ones dropped; a new agent whose only
    configured address is dead registers with one of them."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            leader = _Control(ok=True, term=3)
            addr = await _serve(stack, leader)
            other = _closed_port()
            leader.controlplanes = [addr, other, "bad host:1", "h:0", "x" * 400 + ":1", addr]
            first = _session([addr], tmp_path)
            await _running(stack, first)
            assert first.servers == (addr, other)
            stored = tmp_path / session_mod.CONTROLPLANES_FILE
            assert stat.S_IMODE(stored.stat().st_mode) == 0o600
            assert json.loads(stored.read_text()) == {"controlplanes": [addr, other]}

            dead = _closed_port()
            second = _session([dead], tmp_path)
            assert second.servers == (dead, addr, other)
            await _running(stack, second)
            assert leader.registers == ["n1", "n1"]

    asyncio.run(main())


# Two control planes in a process of their own: the first accepts the Register, lists itself and the second,
# then breaks the stream and refuses any later Register (a leader that died); the second accepts under term 2.
# Not in the test's process: grpc.aio there, with the agent's streams, hung in server.stop after a stream broke
# (1 run in 3), and in a second thread's event loop its poller failed (BlockingIOError, 1 run in 20).
_DYING_PAIR = """
import asyncio, sys
import grpc
from llmgw.api.v1 import agent_pb2 as pb, agent_pb2_grpc
from llmgw.core import skew

first, second = sys.argv[1], sys.argv[2]

class Control(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, term, listed):
        self.term, self.listed, self.dead = term, listed, False

    async def Connect(self, request_iterator, context):
        reg = await anext(request_iterator)
        yield pb.ControlMessage(ack=pb.Ack(seq=reg.seq, ok=not self.dead, protocol=skew.PROTOCOL, term=self.term,
                                           controlplanes=self.listed, error="gone" if self.dead else ""))
        if self.listed:
            self.dead = True
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this control plane went away")
        await asyncio.Event().wait()

async def main():
    servers = []
    for addr, servicer in ((first, Control(1, [first, second])), (second, Control(2, []))):
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServiceServicer_to_server(servicer, server)
        server.add_insecure_port(addr)
        await server.start()
        servers.append(server)
    print("ready", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_learned_controlplane_is_tried_when_the_only_configured_one_dies(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Configured with the leader alone, which lists a second control plane and then breaks the stream: the agent
    registers with the second in the same round, not after a backoff."""
    first, second = _closed_port(), _closed_port()
    proc = subprocess.Popen([sys.executable, "-c", _DYING_PAIR, first, second], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"

        async def main() -> None:
            async with contextlib.AsyncExitStack() as stack:
                session = _session([first], tmp_path)
                await _running(stack, session)
                while session.term != 2:  # the second's term: registered there
                    await asyncio.wait_for(session.connected.wait(), GUARD_S)
                    await asyncio.sleep(0.01)

        with caplog.at_level(logging.INFO, logger=session_mod.__name__):
            asyncio.run(asyncio.wait_for(main(), GUARD_S))
        registered = [r.getMessage() for r in caplog.records if r.getMessage().startswith("registered with")]
        assert [m.split()[2] for m in registered] == [first, second]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("content", [b"{not json", b'{"controlplanes": "h:1"}', b"[1, 2]", b"\xff\xfe"])
def test_unusable_file_is_ignored_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     content: bytes) -> None:
    """A corrupt controlplanes.json leaves the rotation as configured, with one warning naming the file."""
    (tmp_path / session_mod.CONTROLPLANES_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=session_mod.__name__):
        session = _session(["127.0.0.1:1"], tmp_path)
    assert session.servers == ("127.0.0.1:1",)
    assert len(caplog.records) == 1 and session_mod.CONTROLPLANES_FILE in caplog.records[0].getMessage()


def test_missing_file_and_invalid_entries(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No file: the configured servers alone, quietly; a stored list drops invalid entries and configured ones."""
    with caplog.at_level(logging.WARNING, logger=session_mod.__name__):
        assert _session(["127.0.0.1:1"], tmp_path / "absent").servers == ("127.0.0.1:1",)
    assert not caplog.records
    doc: dict[str, Any] = {"controlplanes": ["127.0.0.1:1", "[::1]:2", "::1:3", "h:70000", 5, "cp2:9"]}
    (tmp_path / session_mod.CONTROLPLANES_FILE).write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger=session_mod.__name__):
        assert _session(["127.0.0.1:1"], tmp_path).servers == ("127.0.0.1:1", "[::1]:2", "cp2:9")
    assert len(caplog.records) == 3


def test_control_addr() -> None:
    """HOST:PORT with a port 1-65535, bracketed IPv6, no whitespace, at most 300 characters; nothing else."""
    good = ["cp1:8081", "10.0.0.1:1", "[fd00::1]:65535", "a" * 295 + ":8081"]
    bad = ["cp1", "cp1:", ":8081", "cp1:0", "cp1:65536", "cp 1:8081", "cp1:80\n", "http://cp1:8081", "fd00::1:8081",
           "[]:1", "a" * 300 + ":8081", "", None, 8081]
    assert [session_mod.control_addr(a) for a in good] == good
    assert [session_mod.control_addr(a) for a in bad] == [None] * len(bad)


def test_the_leader_announcing_a_new_controlplane_adds_it(tmp_path: Path) -> None:
    """A ControlPlanes message on the stream (a standby started after this agent registered) adds the standby
    to the rotation and to controlplanes.json, as a Register's answer would."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            leader = _Control(ok=True, term=3)
            addr = await _serve(stack, leader)
            session = _session([addr], tmp_path)
            await _running(stack, session)
            assert session.servers == (addr,)
            leader.commands.put_nowait(pb.ControlMessage(term=3, controlplanes=pb.ControlPlanes(
                addrs=[addr, "127.0.0.1:4242"])))

            async def learned() -> None:
                while "127.0.0.1:4242" not in session.servers:  # noqa: ASYNC110 (state the stream changes)
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(learned(), GUARD_S)
            stored = json.loads((tmp_path / session_mod.CONTROLPLANES_FILE).read_text())
            assert stored["controlplanes"] == [addr, "127.0.0.1:4242"]

    asyncio.run(main())


def test_while_a_standby_answers_the_agent_retries_soon_not_after_its_backoff(tmp_path: Path) -> None:
    """A round refused by a standby with no leader to name (the dead leader's lease still running out) is
    followed by another within about a second, not by the backoff (600 s here): once the standby leads, the
    agent registers with it at its next round."""

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            standby = _Control(ok=False, controlplanes=["127.0.0.1:1"])
            addr = await _serve(stack, standby)
            session = _session([addr], tmp_path)
            task = asyncio.create_task(session.run_forever())
            stack.push_async_callback(lambda: _cancel(task))

            async def refused_twice() -> None:
                while len(standby.registers) < 2:  # noqa: ASYNC110 (state the server changes)
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(refused_twice(), GUARD_S)
            standby.ok, standby.term = True, 2  # it took the lease
            await asyncio.wait_for(session.connected.wait(), GUARD_S)
            assert session.term == 2

    asyncio.run(main())


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
