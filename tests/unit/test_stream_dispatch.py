"""The agent stream's dispatch tables: every message kind either end can receive has a handler, or is listed
as ignored on purpose with why, so a kind added to agent.proto without one fails here instead of being dropped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor

from llmgw.agent.session import fencing, handlers
from llmgw.agent.session.addresses import Rotation
from llmgw.agent.session.heartbeats import Renewal
from llmgw.agent.session.outbox import Outbox
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.control.agentsvc import inbound
from llmgw.core.agentupgrade import State, UpgradeStatus

CONNECT = pb.DESCRIPTOR.services_by_name["AgentService"].methods_by_name["Connect"]


def _kinds(message: Descriptor) -> set[str]:
    """The kinds of every oneof of ``message``, read from the descriptor."""
    return {f.name for oneof in message.oneofs for f in oneof.fields}


def _check_table(message: Descriptor, table: dict[str, object], ignored: dict[str, str]) -> None:
    kinds = _kinds(message)
    assert not set(table) & set(ignored), "a kind is both handled and listed as not handled"
    assert set(table) | set(ignored) == kinds, (
        f"{message.name}: kinds without a handler: {sorted(kinds - set(table) - set(ignored))}; "
        f"names in the table that are no kind: {sorted((set(table) | set(ignored)) - kinds)}")
    assert all(why.strip() for why in ignored.values()), "each kind not handled says why"


def test_the_stream_carries_one_oneof_each_way() -> None:
    """Connect streams AgentMessage up and ControlMessage down, each with its kinds in the one oneof ``body``
    (a second oneof would need the dispatch to look at it too)."""
    assert (CONNECT.input_type, CONNECT.output_type) == (pb.AgentMessage.DESCRIPTOR, pb.ControlMessage.DESCRIPTOR)
    assert [o.name for o in pb.AgentMessage.DESCRIPTOR.oneofs] == ["body"]
    assert [o.name for o in pb.ControlMessage.DESCRIPTOR.oneofs] == ["body"]


def test_the_agent_has_a_handler_for_every_kind_the_control_plane_sends() -> None:
    """handlers.HANDLERS and NOT_HANDLED together are ControlMessage's kinds; the fenced ones are kinds too."""
    _check_table(CONNECT.output_type, handlers.HANDLERS, handlers.NOT_HANDLED)
    assert fencing.FENCED <= set(handlers.HANDLERS)


def test_the_control_plane_has_a_handler_for_every_kind_an_agent_sends() -> None:
    """inbound.HANDLERS and NOT_HANDLED together are AgentMessage's kinds."""
    _check_table(CONNECT.input_type, inbound.HANDLERS, inbound.NOT_HANDLED)


def _agent_handlers(tmp_path: Path) -> tuple[handlers.Handlers, Outbox]:
    async def nothing(*_a: object) -> None:
        return None

    commands = handlers.Commands(start=nothing, stop=nothing, drain=nothing, statuses=list,
                                 logs=None)  # type: ignore[arg-type]
    outbox = Outbox()
    return handlers.Handlers(commands, outbox, fence=fencing.Fence(), rotation=Rotation((), tmp_path),
                             renewal=Renewal("n1", None)), outbox


def test_an_unknown_kind_is_logged_and_ignored_and_an_ack_quietly(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A message whose kind the agent does not know (a newer control plane's) is said once in the log and not
    answered; an Ack, ignored on purpose, is not logged."""
    h, outbox = _agent_handlers(tmp_path)
    outbox.queue = asyncio.Queue()
    with caplog.at_level(logging.WARNING, logger=handlers.__name__):
        h.dispatch(pb.ControlMessage(seq=3))
        h.dispatch(pb.ControlMessage(seq=4, ack=pb.Ack(seq=1, ok=True)))
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring a command this agent does not know (None); is the control plane newer?"]
    assert outbox.queue.empty()


def test_a_command_is_acked_when_its_handler_says_so(tmp_path: Path) -> None:
    """stop_shard is acked at once with the command's seq; controlplanes, which wants no answer, is not."""
    async def main() -> list[pb.AgentMessage]:
        h, outbox = _agent_handlers(tmp_path)
        outbox.queue = asyncio.Queue()
        h.dispatch(pb.ControlMessage(seq=9, term=1, stop_shard=pb.StopShard(shard_id="s1")))
        h.dispatch(pb.ControlMessage(seq=10, term=1, controlplanes=pb.ControlPlanes(addrs=["cp2:8081"])))
        await asyncio.sleep(0)
        return [outbox.queue.get_nowait() for _ in range(outbox.queue.qsize())]

    sent = asyncio.run(main())
    assert [(m.WhichOneof("body"), m.ack.seq, m.ack.ok) for m in sent] == [("ack", 9, True)]


def test_an_upgrade_status_said_between_streams_goes_out_on_the_next(tmp_path: Path) -> None:
    """An upgrade that fails while the agent redials is not lost: its FAILED goes out with the next stream's first
    message (and only the last status said, once)."""
    said: list[Callable[[UpgradeStatus], None]] = []

    async def nothing(*_a: object) -> None:
        return None

    commands = handlers.Commands(start=nothing, stop=nothing, drain=nothing, statuses=list,
                                 logs=None,  # type: ignore[arg-type]
                                 upgrade=lambda _req, send: said.append(send))
    outbox = Outbox()
    h = handlers.Handlers(commands, outbox, fence=fencing.Fence(), rotation=Rotation((), tmp_path),
                          renewal=Renewal("n1", None))
    outbox.queue = asyncio.Queue()
    h.dispatch(pb.ControlMessage(seq=1, term=1, upgrade_agent=pb.UpgradeAgent(id="a1", version="0.2.1",
                                                                              index_url="http://i/")))
    assert len(said) == 1 and outbox.queue.empty()  # answered by statuses, not an Ack
    outbox.queue = None  # the stream went down
    said[0](UpgradeStatus("a1", "0.2.1", State.INSTALLING, "downloading"))
    said[0](UpgradeStatus("a1", "0.2.1", State.FAILED, "pip install exited 1", ("ERROR: no llmgw",)))
    outbox.queue = asyncio.Queue()  # the next stream: the control plane's first message is its Provision
    h.dispatch(pb.ControlMessage(seq=1, term=1, provision=pb.Provision()))
    h.dispatch(pb.ControlMessage(seq=2, term=1, controlplanes=pb.ControlPlanes()))
    sent = [outbox.queue.get_nowait() for _ in range(outbox.queue.qsize())]
    assert [(m.upgrade_status.id, m.upgrade_status.state, m.upgrade_status.message,
             list(m.upgrade_status.last_output)) for m in sent if m.WhichOneof("body") == "upgrade_status"] == [
        ("a1", pb.UPGRADE_FAILED, "pip install exited 1", ["ERROR: no llmgw"])]
