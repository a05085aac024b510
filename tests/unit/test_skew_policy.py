"""The skew policy's decisions (``core.skew``) on plain data: who works with whom, what a refusal says."""

from __future__ import annotations

import pytest

from llmgw.core import skew


@pytest.mark.parametrize(("peer", "allowed"), [(0, True), (1, True), (2, True), (3, False), (7, False)])
def test_a_control_plane_at_2_serves_protocols_1_and_2_and_one_that_sends_none(peer: int, allowed: bool) -> None:
    assert (skew.peer_refusal("agent", peer, "x", server_protocol=2) == "") is allowed


def test_a_control_plane_at_3_refuses_protocol_1_and_a_peer_that_sends_none() -> None:
    for peer in (0, 1):
        said = skew.peer_refusal("agent", peer, "0.1.0", server_protocol=3, server_version="0.3.0")
        assert said.startswith("this agent 0.1.0 (protocol 1) is too old for the control plane 0.3.0 (protocol 3)")
        assert "upgrade this agent to the control plane's version (`llmgw node upgrade NODE`)" in said
    assert "node upgrade" not in skew.peer_refusal("router", 1, "0.1.0", server_protocol=3)


def test_a_peer_refuses_a_control_plane_older_than_itself() -> None:
    said = skew.server_refusal("router", 0, "", own_protocol=2, own_version="0.2.0")
    assert said.startswith("this router 0.2.0 (protocol 2) is newer than the control plane of an unknown version "
                           "(protocol 1): a router may not be newer than its control plane")
    assert skew.server_refusal("router", 2, "0.2.0", own_protocol=1, own_version="0.1.9") == ""
    assert skew.server_refusal("agent", 2, "0.2.0", own_protocol=2) == ""


@pytest.mark.parametrize(("header", "protocol"), [(None, 1), ("", 1), ("0", 1), (" 2 ", 2), ("3", 3), ("two", 1)])
def test_the_protocol_header_read(header: str | None, protocol: int) -> None:
    assert skew.parse_header(header) == protocol


def test_headers_and_skewed() -> None:
    assert skew.headers(2, "0.2.0") == {skew.PROTOCOL_HEADER: "2", skew.VERSION_HEADER: "0.2.0"}
    assert skew.headers(2) == {skew.PROTOCOL_HEADER: "2"}
    assert skew.skewed("0.1.0", "0.2.0") and not skew.skewed("0.2.0", "0.2.0")
    assert not skew.skewed("", "0.2.0") and not skew.skewed("0.1.0", "")  # unknown: not flagged
