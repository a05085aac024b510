"""Inside the skew policy the older side ignores what a newer peer adds (issue 29): the documents a router reads from
a control plane one release ahead (the route table: a new field anywhere, a new kind of limit on a key), and the
protobufs an agent reads from a newer control plane (a new field in a message, a new kind of command) are read,
not refused, with everything the older side knows intact."""

from __future__ import annotations

import logging

import pytest

from llmgw.api import routing
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.router.table import RouteTable


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    """One protobuf field as a newer release might write it: a varint, or length-delimited bytes."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


NEWER_TABLE = {
    "version": 7, "a_field_of_a_newer_release": {"anything": [1, 2]},
    "models": [{"name": "m", "state": "Ready", "new_model_field": True, "routing": "a-policy-of-a-newer-release",
                "endpoints": [{"replica_id": "m-1", "url": "http://127.0.0.1:9", "new_endpoint_field": "x"}]}],
    "auth": {"required": True, "new_auth_field": 1,
             "keys": [{"id": "k1", "sha256": "ab" * 32, "new_key_field": "y",
                       "limits": {"requests_per_minute": 5, "images_per_day": 10}}]},
}


def test_a_table_with_fields_of_a_newer_release_is_read_by_the_router(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=routing.__name__):
        doc = routing.EndpointsDoc.from_doc(NEWER_TABLE)
        table = RouteTable.from_doc(NEWER_TABLE)
    assert doc.version == table.version == 7
    assert [m.name for m in table.models] == ["m"] and [e.replica_id for e in table.models[0].endpoints] == ["m-1"]
    key = doc.auth.keys[0]
    assert (key.id, doc.auth.required) == ("k1", True)
    # The limit it knows is applied; the newer kind is said, not a reason to drop the key's every limit.
    assert key.limits.requests_per_minute == 5
    assert any("images_per_day is not a limit this router knows" in r.getMessage() for r in caplog.records)


def test_a_register_with_a_field_of_a_newer_release_parses() -> None:
    known = pb.AgentMessage(seq=3, register=pb.Register(node_id="n1", agent_version="0.3.0", protocol=3))
    newer_register = known.register.SerializeToString() + _field(99, 42) + _field(100, b"later")
    wire = _field(1, 3) + _field(_number(pb.AgentMessage, "register"), newer_register) + _field(120, b"x")
    got = pb.AgentMessage.FromString(wire)
    assert (got.seq, got.register.node_id, got.register.agent_version, got.register.protocol) == (3, "n1", "0.3.0", 3)


def test_a_control_message_of_a_newer_release_parses() -> None:
    """A new field in a known message is skipped; a command this release has no field for parses as a message of no
    kind (``test_stream_dispatch`` shows the agent logs such a one and goes on)."""
    ack = pb.Ack(seq=1, ok=True, protocol=3, server_version="0.3.0").SerializeToString() + _field(50, 1)
    with_ack = pb.ControlMessage.FromString(_field(1, 9) + _field(_number(pb.ControlMessage, "ack"), ack))
    assert with_ack.WhichOneof("body") == "ack"
    assert (with_ack.seq, with_ack.ack.ok, with_ack.ack.protocol, with_ack.ack.server_version) == (9, True, 3, "0.3.0")

    # A command this release has no field for (a newer release's ControlMessage body, field 99).
    command = pb.ControlMessage.FromString(_field(1, 10) + _field(99, _field(1, 5)))
    assert command.seq == 10 and command.WhichOneof("body") is None


def _number(message: type, field: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[field].number)
