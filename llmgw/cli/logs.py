"""``llmgw logs NODE [SHARD] [-n N] [-f]``: a node agent's own log, or one of its shards', through the control plane.

The control plane answers ``GET /api/v1/nodes/{node}/logs`` with NDJSON, one
object a line: ``{"lines": [...]}`` batches, or ``{"error": "..."}`` when the
agent could not answer. Lines are printed as they arrive, a batch at a time,
and plainly (no Rich): log lines contain brackets that markup would eat, and
`llmgw logs node05 | grep` must see exactly what the engine wrote.
"""

from __future__ import annotations

import json
import os
import sys
from urllib.parse import quote

import httpx
import typer

from llmgw.cli import client as client_mod

CONNECT_TIMEOUT_S = 10.0
# Without --follow the agent answers at once; this only bounds a hung control plane.
READ_TIMEOUT_S = 60.0


def logs(node: str, shard: str | None, lines: int, follow: bool, url: str) -> int:
    """Prints the log and returns the exit status: 0 when it ended or Ctrl-C stopped it, 1 on an error."""
    base = url.rstrip("/")
    params = {"lines": str(lines), "follow": "true" if follow else "false"}
    if shard:
        params["shard"] = shard
    # No read timeout when following: a quiet engine writes nothing for hours.
    timeout = httpx.Timeout(CONNECT_TIMEOUT_S, read=None if follow else READ_TIMEOUT_S)
    try:
        token = client_mod.token_for(base)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(base_url=base, timeout=timeout, trust_env=False, headers=headers,
                          verify=client_mod.verify_for(base)) as http:
            with http.stream("GET", f"/api/v1/nodes/{quote(node, safe='')}/logs", params=params) as resp:
                if resp.status_code >= 300:
                    resp.read()
                    return _fail(_error_message(resp))
                for raw in resp.iter_lines():
                    if not raw.strip():
                        continue
                    try:
                        doc = json.loads(raw)
                    except ValueError:
                        return _fail(f"the control plane at {base} sent a line that is not JSON: {raw[:200]!r}")
                    if not isinstance(doc, dict):
                        return _fail(f"the control plane at {base} sent {raw[:200]!r}, not a JSON object")
                    if doc.get("error"):
                        return _fail(str(doc["error"]))
                    _print(doc.get("lines") or [])
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # `llmgw logs node05 | head`: the reader left, which is an ending, not an error. Pointing stdout
        # at /dev/null stops Python's flush at exit from raising it a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except httpx.ConnectError:
        return _fail(client_mod.unreachable(base))
    except httpx.HTTPError as e:
        return _fail(f"talking to the control plane at {base} failed: {str(e) or type(e).__name__}")
    return 0


def _print(lines: list[object]) -> None:
    if lines:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
        sys.stdout.flush()


def _error_message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        message = err.get("message") if isinstance(err, dict) else err
        if message:
            return str(message)
    return f"GET {resp.request.url.path} answered {resp.status_code}: {resp.text[:200]}"


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 1


def register(app: typer.Typer) -> None:
    """Adds ``logs`` to ``app``."""

    @app.command("logs")
    def logs_command(
        node: str = typer.Argument(..., help="Node id, as `llmgw get nodes` lists it"),
        shard: str = typer.Argument(None, help="A shard on that node [default: the agent's own log]"),
        lines: int = typer.Option(100, "-n", "--lines", min=1, max=10000, help="How many of the last lines"),
        follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines until Ctrl-C"),
        url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default "
                                                     f"{client_mod.DEFAULT_URL}]"),
    ) -> None:
        """Print a node agent's log, or one of its shards' (an engine's output)."""
        raise typer.Exit(logs(node, shard, lines, follow, url or client_mod.default_url()))
