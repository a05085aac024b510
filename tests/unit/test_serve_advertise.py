"""`llmgw server --advertise-address`: a value no other machine could use is refused at start, in words."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw import serve
from llmgw.core.errors import LlmgwError


@pytest.mark.parametrize("host", ["", "ctl.example.com", "ctl.example.com.", "node-05", "10.0.0.5", "::1",
                                  "[fd00::5]", "localhost", "db_1.internal"])
def test_a_host_name_or_address_is_taken(host: str) -> None:
    """Names, IPv4 and IPv6 (bare or bracketed) addresses and the empty default pass."""
    serve.check_advertise(host)


@pytest.mark.parametrize(("host", "says"), [
    ("http://ctl.example.com", "a URL"),
    ("ctl.example.com:8080", "a port is not part of it"),
    ("10.0.0.5:8081", "a port is not part of it"),
    ("0.0.0.0", "a wildcard"),
    ("::", "a wildcard"),
    ("[::]", "a wildcard"),
    ("ctl example", "not a host name"),
    ("-ctl.example", "not a host name"),
    ("ctl..example", "not a host name"),
    ("a" * 64 + ".example", "not a host name"),
])
def test_a_value_no_machine_could_use_is_refused_saying_what_to_give(host: str, says: str) -> None:
    """Each refusal names the flag and the value, says what is wrong, and says what to give instead."""
    with pytest.raises(LlmgwError) as e:
        serve.check_advertise(host)
    message = str(e.value)
    assert message.startswith(f"--advertise-address {host!r}: ") and says in message, message
    assert "give the host name or IP address other machines reach this server by" in message, message


def test_server_start_refuses_it_before_touching_the_data_directory(tmp_path: Path) -> None:
    """serve.run refuses a bad --advertise-address before it initialises anything (no database, no CA made)."""
    cfg = serve.ServerConfig(host="127.0.0.1", data_dir=tmp_path / "data", advertise="http://ctl:8080")

    async def start() -> None:
        await serve.run(cfg, stop=asyncio.Event())

    with pytest.raises(LlmgwError, match="--advertise-address 'http://ctl:8080': a URL"):
        asyncio.run(start())
    assert not (tmp_path / "data").exists()
