"""``llmgw get controlplanes`` against a real HTTP server on loopback answering the REST document."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app

DOC: dict[str, Any] = {"self": "cp-b", "controlplanes": [
    {"id": "cp-a", "role": "leader", "term": 4, "lease_age_s": 0.437, "http_url": "http://10.0.0.1:8080",
     "agent_addr": "10.0.0.1:8081", "version": "0.15.0", "last_seen_s": 0.4},
    {"id": "cp-b", "role": "standby", "term": 0, "lease_age_s": -1.0, "http_url": "http://10.0.0.2:8080",
     "agent_addr": "10.0.0.2:8081", "version": "0.15.0", "last_seen_s": 0.1},
    {"id": "cp-c", "role": "gone", "term": 0, "lease_age_s": -1.0, "http_url": "", "agent_addr": "",
     "version": "", "last_seen_s": 40.0},
]}


class _ControlPlane(http.server.BaseHTTPRequestHandler):
    """Answers ``GET /api/v1/controlplanes`` with ``answer`` (and its status); records the paths asked."""

    answer: tuple[int, dict[str, Any]] = (200, DOC)
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        _ControlPlane.seen.append(self.path)
        status, doc = _ControlPlane.answer
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def control_plane() -> Iterator[str]:
    _ControlPlane.seen, _ControlPlane.answer = [], (200, DOC)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ControlPlane)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _cli(args: list[str], tmp_path: Path) -> Any:
    # No saved login nor token of whoever runs the tests leaks into the request.
    return CliRunner().invoke(app, args, env={"XDG_CONFIG_HOME": str(tmp_path), "LLMGW_TOKEN": ""})


def test_the_table_marks_this_instance_and_shows_term_and_lease_only_for_the_leader(control_plane: str,
                                                                                       tmp_path: Path) -> None:
    """Columns NAME ROLE TERM LEASE-AGE ADDRESS AGENTS VERSION; `*` after the answering instance; "-" where none."""
    result = _cli(["get", "controlplanes", "--url", control_plane], tmp_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "NAME    ROLE      TERM   LEASE-AGE   ADDRESS                AGENTS          VERSION",
        "cp-a    leader    4      0.4s        http://10.0.0.1:8080   10.0.0.1:8081   0.15.0",
        "cp-b*   standby   -      -           http://10.0.0.2:8080   10.0.0.2:8081   0.15.0",
        "cp-c    gone      -      -           -                      -               -",
    ]
    assert _ControlPlane.seen == ["/api/v1/controlplanes"]


def test_the_aliases_and_json_output(control_plane: str, tmp_path: Path) -> None:
    """`get cp` and `get controlplane` are the same command; `-o json` prints the REST document as it came."""
    table = _cli(["get", "controlplanes", "--url", control_plane], tmp_path).stdout
    assert _cli(["get", "cp", "--url", control_plane], tmp_path).stdout == table
    result = _cli(["get", "controlplane", "-o", "json", "--url", control_plane], tmp_path)
    assert result.exit_code == 0 and json.loads(result.stdout) == DOC


def test_an_empty_list_says_why_and_an_error_is_the_servers_sentence(control_plane: str, tmp_path: Path) -> None:
    """No instances: nothing on stdout (a script reads no row) and a sentence saying so on stderr; an error answer:
    its message and exit status 1."""
    _ControlPlane.answer = (200, {"controlplanes": [], "self": ""})
    result = _cli(["get", "controlplanes", "--url", control_plane], tmp_path)
    assert result.exit_code == 0
    assert result.stdout == "" and "(none listed: this server keeps no leader lease)" in result.stderr
    _ControlPlane.answer = (500, {"error": {"message": "the database did not answer; retry in a few seconds",
                                            "type": "server_error", "code": "store_unavailable", "param": None}})
    result = _cli(["get", "cp", "--url", control_plane], tmp_path)
    assert result.exit_code == 1 and "the database did not answer" in result.stderr
    assert "Traceback" not in result.output
