"""Auth is off only while no key exists; a standalone router listening beyond loopback says so at start."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from llmgw.router import standalone
from llmgw.router.settings import RouterSettings

TABLE = {"version": 1, "models": [{"name": "m", "endpoints": [{"replica_id": "r", "url": "http://127.0.0.1:9"}]}]}
KEYED = {**TABLE, "auth": {"required": True, "keys": [{"id": "k1", "sha256": "ab" * 32}]}}


def _build(tmp_path: Path, doc: dict[str, object], host: str) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps(doc))
    standalone.build(RouterSettings(table_file=table, host=host))


@pytest.mark.parametrize("host, doc, warned", [
    ("0.0.0.0", TABLE, True),  # open to the network: said
    ("10.1.2.3", TABLE, True),
    ("127.0.0.1", TABLE, False),  # loopback: auth off is fine
    ("::1", TABLE, False),
    ("0.0.0.0", KEYED, False),  # keys exist: auth is on
])
def test_keyless_table_beyond_loopback_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       host: str, doc: dict[str, object], warned: bool) -> None:
    """Building the router over a keyless table warns exactly when the listen is not loopback."""
    with caplog.at_level(logging.WARNING, logger="llmgw.router.auth"):
        _build(tmp_path, doc, host)
    said = [r.getMessage() for r in caplog.records if r.name == "llmgw.router.auth"]
    assert bool(said) is warned
    if warned:
        assert f"listens on {host}" in said[0] and "llmgw key create" in said[0]
