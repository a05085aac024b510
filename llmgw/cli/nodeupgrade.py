"""``llmgw node upgrade NODE|--all [--version V]``: each node's agent upgraded to another llmgw, one node at a time.

For each node in turn: ``POST /api/v1/nodes/NODE/upgrade`` (the agent installs the release from the cluster's
engine index and re-executes into it, keeping its engines), then ``GET`` it each second, printing each step,
until the control plane's health gate says ``done`` (the node is back with the new version and every shard
Ready) or ``failed``. The first failure stops the command (exit 1) naming the node, why, and the nodes left as
they were; the next node is never touched before this one passed the gate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import typer

from llmgw.cli import client as client_mod
from llmgw.core.errors import LlmgwError

#: How long the CLI follows one node before it gives up on it (the control plane's own deadlines come first).
FOLLOW_S = 2400.0


def _follow(c: client_mod.Client, node: str, first: dict[str, Any], *, poll_s: float) -> dict[str, Any]:
    """Prints each step of the node's attempt until it ends; returns the last document."""
    doc, said, until = first, "", time.monotonic() + FOLLOW_S
    while True:
        line = f"node/{node}: {doc['state']}" + (f": {doc['message']}" if doc.get("message") else "")
        if line != said:
            typer.echo(line)
            said = line
        if doc["state"] in ("done", "failed"):
            return doc
        if time.monotonic() > until:
            return {**doc, "state": "failed", "message": f"no end seen within {FOLLOW_S:.0f} s; `llmgw describe node "
                                                         f"{node}` shows where it stands"}
        time.sleep(poll_s)
        doc = c.get(f"/api/v1/nodes/{quote(node, safe='')}/upgrade")


def register(node_app: typer.Typer, *, url_opt: Any, fail: Callable[[str], typer.Exit]) -> None:
    @node_app.command("upgrade")
    def upgrade(
        node: str = typer.Argument("", help="The node whose agent to upgrade (or --all)"),
        all_nodes: bool = typer.Option(False, "--all", help="Every node, one at a time, in name order; nodes that "
                                                            "already run the version are passed over"),
        version: str = typer.Option("", "--version", help="The llmgw release to run (default: the control "
                                                          "plane's own)"),
        ready_timeout: float = typer.Option(300.0, "--ready-timeout", help="Seconds a node has, after its agent "
                                                                           "restarts, to be back and Ready"),
        poll: float = typer.Option(1.0, "--poll", help="Seconds between progress reads", hidden=True),
        url: str = url_opt,
    ) -> None:
        """Upgrade a node's agent (or every node's, one at a time) to another llmgw, from the cluster's index.

        Engines keep running and are adopted by the new agent; a failed install leaves the old agent running.
        """
        if bool(node) == all_nodes:
            raise fail("name a node, or --all (not both): `llmgw node upgrade node01` or `llmgw node upgrade --all`")
        c = client_mod.Client(url or client_mod.default_url())
        try:
            names = sorted(n["id"] for n in c.get("/api/v1/nodes")["items"]) if all_nodes else [node]
            body: dict[str, Any] = {"ready_timeout_s": ready_timeout, "skip_if_current": all_nodes}
            if version:
                body["version"] = version
            for i, name in enumerate(names):
                _, first = c.request("POST", f"/api/v1/nodes/{quote(name, safe='')}/upgrade", json=body)
                doc = _follow(c, name, first, poll_s=poll)
                if doc["state"] == "failed":
                    for line in doc.get("last_output", [])[-10:]:
                        typer.echo(f"  | {line}", err=True)
                    left = names[i + 1:]
                    raise fail(f"upgrading node {name} to llmgw {doc['version']} failed: {doc['message']}"
                               + (f"; stopped there: {', '.join(left)} not upgraded" if left else ""))
                typer.echo(f"node/{name} runs llmgw {doc['version']}")
        except LlmgwError as e:
            raise fail(str(e)) from None
        finally:
            c.close()
