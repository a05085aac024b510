"""``llmgw engine install|list|forget|remove``: engine versions wanted per node or pool, over ``/api/v1/engines``.

``install`` records a want; the control plane sends it to the node (or every node
of the pool) and its agent installs it, from the cluster's package index, and
reports the install's state, which ``list``, ``get nodes -o wide`` and ``describe
node`` show. ``forget`` drops the want and leaves the install; ``remove`` drops it
and removes the install, refused while a replica may run that version.
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import output as out
from llmgw.cli import tables
from llmgw.core.errors import LlmgwError

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def target(args: list[str], pool: str | None, command: str) -> dict[str, str]:
    """The body for NODE ENGINE VERSION, or ENGINE VERSION with --pool; LlmgwError saying the usage otherwise."""
    if pool:
        if len(args) != 2:
            raise LlmgwError(f"with --pool give ENGINE VERSION: `llmgw engine {command} --pool {pool} vllm 0.11.2`")
        return {"engine": args[0], "version": args[1], "pool": pool}
    if len(args) != 3:
        raise LlmgwError(f"give NODE ENGINE VERSION (or --pool POOL ENGINE VERSION): `llmgw engine {command} "
                         "node05 vllm 0.11.2`")
    return {"node": args[0], "engine": args[1], "version": args[2]}


def where(body: dict[str, str]) -> str:
    return f"node {body['node']}" if body.get("node") else f"pool {body['pool']}"


def install_items(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """``/api/v1/engines``'s installs, one item each, with its node and pool."""
    return [{**i, "node": n["node"], "pool": n["pool"]} for n in doc["nodes"] for i in n["installs"]]


INSTALLS = out.Listing("install", (
    out.Column("NODE", lambda i: i["node"]),
    out.Column("POOL", lambda i: i["pool"] or "-"),
    out.Column("ENGINE", lambda i: i["engine"]),
    out.Column("VERSION", lambda i: i["version"]),
    out.Column("VARIANT", lambda i: i["variant"] or "-"),
    out.Column("STATE", tables.install_state),
    out.Column("MESSAGE", lambda i: i["message"] or "-"),
), name=lambda i: f"{i['node']}:{i['engine']}-{i['version']}" + (f"-{i['variant']}" if i["variant"] else ""))

WANTS = out.Listing("want", (
    out.Column("SCOPE", lambda w: w["scope"]),
    out.Column("ENGINE", lambda w: w["engine"]),
    out.Column("VERSION", lambda w: w["version"]),
), name=lambda w: f"{w['scope']}:{w['engine']}-{w['version']}")


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", markup=True)
    return typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Adds ``engine install|list|forget|remove`` to ``app``."""
    engine_app = typer.Typer(no_args_is_help=True, help="Engines llmgw installs on nodes, per node or pool.")
    app.add_typer(engine_app, name="engine")
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")
    args_arg = typer.Argument(..., help="NODE ENGINE VERSION, or ENGINE VERSION with --pool")
    pool_opt = typer.Option(None, "--pool", help="Every node whose label pool is this")

    def _call(method: str, path: str, body: dict[str, str], url: str | None) -> Any:
        try:
            _, doc = client_mod.Client(url or client_mod.default_url()).request(method, path, json=body)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        return doc

    def _target(args: list[str], pool: str | None, command: str) -> dict[str, str]:
        try:
            return target(args, pool, command)
        except LlmgwError as e:
            raise _fail(str(e)) from None

    @engine_app.command("install")
    def install(args: list[str] = args_arg, pool: str = pool_opt, url: str = url_opt) -> None:
        """Want ENGINE VERSION installed on NODE (or every node of --pool); its agent installs and re-checks it."""
        body = _target(args, pool, "install")
        doc = _call("POST", "/api/v1/engines", body, url)
        said = "wanted" if doc.get("created") else "already wanted"
        console.print(f"{body['engine']} {body['version']} {said} on {where(body)}; `llmgw engine list` shows "
                      "its install", markup=False)

    @engine_app.command("forget")
    def forget(args: list[str] = args_arg, pool: str = pool_opt, url: str = url_opt) -> None:
        """Stop wanting ENGINE VERSION there; what is installed stays (`llmgw engine remove` removes it)."""
        body = _target(args, pool, "forget")
        _call("DELETE", "/api/v1/engines", body, url)
        console.print(f"{body['engine']} {body['version']} no longer wanted on {where(body)}", markup=False)

    @engine_app.command("remove")
    def remove(args: list[str] = args_arg, pool: str = pool_opt, url: str = url_opt) -> None:
        """Remove ENGINE VERSION's install from NODE (or --pool); refused while a replica may use it."""
        body = _target(args, pool, "remove")
        doc = _call("POST", "/api/v1/engines/remove", body, url)
        if doc["sent"]:
            console.print(f"removing {body['engine']} {body['version']} on {', '.join(doc['sent'])}", markup=False)
        if doc["not_connected"]:
            err_console.print(f"not connected, so not removed: {', '.join(doc['not_connected'])}; run this again "
                              "once they are", markup=False)

    @engine_app.command("list")
    def list_(output: str = typer.Option("table", "-o", "--output", help="table or json"),
              url: str = url_opt) -> None:
        """The wants, the index nodes install from, and each node's installs with their state."""
        try:
            doc = client_mod.Client(url or client_mod.default_url()).get("/api/v1/engines")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        if output == "json":
            console.print_json(json.dumps(doc))
            return
        s = doc["settings"]
        console.print(f"Index: {s['index_url'] or 'none configured (start the server with --engine-index URL)'}"
                      f"{' (find-links)' if s['find_links'] else ''}; models "
                      f"{'may' if s['models_trigger_installs'] else 'may not'} trigger installs", markup=False)
        view = out.View()
        out.emit(out.text(doc["wants"], WANTS, view) if doc["wants"] else "No wants.\n")
        installs = install_items(doc)
        out.emit(out.text(installs, INSTALLS, view) if installs else "No installs.\n")
