"""``llmgw key create|list|update|disable|enable|delete``: API keys for the router's clients, over ``/api/v1/keys``.

The secret is printed once, by ``create``, on a line of its own so a script can
take it with ``| tail -1``; the control plane keeps only its hash, so a lost key
is replaced (delete it, create another), never shown again.

A key belongs to a project (``--project``, ``default`` unless said) and optionally a user (``--user``);
its budgets are the ``--tokens-per-day``-style flags (``cli.limitflags``), set by operators and admins.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import output as out
from llmgw.cli import priorityflags
from llmgw.cli.limitflags import limits_cell, with_limit_flags
from llmgw.core import units
from llmgw.core.errors import LlmgwError

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def listing(*, now: float | None = None) -> out.Listing:
    """``key list`` and ``get keys``: one row per key, never its secret."""
    def last_used(k: dict[str, Any]) -> str:
        return units.format_ago(float(k.get("last_used_at") or 0), now=time.time() if now is None else now)

    return out.Listing("key", (
        out.Column("ID", lambda k: k["id"]),
        out.Column("NAME", lambda k: k["name"]),
        out.Column("PROJECT", lambda k: k.get("project", "default")),
        out.Column("USER", lambda k: k.get("user") or "-"),
        out.Column("MODELS", lambda k: ", ".join(k["models"]) or "all"),
        out.Column("RPM", lambda k: str(k["rpm"] or "unlimited")),
        out.Column("TPM", lambda k: str(k["tpm"] or "unlimited")),
        out.Column("PRIORITY", lambda k: str(k["priority"])),
        out.Column("LIMITS", lambda k: limits_cell(k.get("limits") or {})),
        out.Column("DISABLED", lambda k: "yes" if k.get("disabled") else "no"),
        out.Column("LAST USED", last_used),
    ), name=lambda k: str(k["id"]))


def _client(url: str | None) -> client_mod.Client:
    return client_mod.Client(url or client_mod.default_url())


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", markup=True)
    return typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Adds ``key create|list|disable|enable|delete`` to ``app``."""
    key_app = typer.Typer(no_args_is_help=True, help="API keys for the OpenAI API (required once one exists).")
    app.add_typer(key_app, name="key")
    # `llmgw keys list` reads as naturally as `llmgw key list`; both work, one is listed in --help.
    app.add_typer(key_app, name="keys", hidden=True)
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")

    @key_app.command("create")
    @with_limit_flags
    def create(
        name: str = typer.Argument(..., help="What the key is for (a person, a service)"),
        models: str = typer.Option("", "--models", help="Comma-separated models it may use [default: all]"),
        rpm: int = typer.Option(0, "--rpm", min=0, help="Requests a minute [0: unlimited]"),
        tpm: int = typer.Option(0, "--tpm", min=0, help="Tokens a minute [0: unlimited]"),
        priority: int = typer.Option(0, "--priority", help="Higher is admitted first when a model is busy"),
        project: str = typer.Option("default", "--project", help="The project the key belongs to"),
        user: str = typer.Option("", "--user", help="The user the key is for [default: none in particular]"),
        priority_class: str | None = priorityflags.class_option(),
        weight: float | None = priorityflags.weight_option(),
        url: str = url_opt,
        *, limits: dict[str, Any],
    ) -> None:
        """Create a key and print its secret, this once."""
        queueing = priorityflags.body(priority_class, weight)
        body = {"name": name, "models": [m.strip() for m in models.split(",") if m.strip()], "rpm": rpm,
                "tpm": tpm, "priority": priority, "project": project, "user": user, "limits": limits}
        try:
            _, doc = _client(url).request("POST", "/api/v1/keys", json=body)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        err_console.print(f"key/{doc['id']} created. Store the key now: it will not be shown again.")
        if queueing:
            try:
                err_console.print(f"key/{doc['id']}: " + priorityflags.said(
                    priorityflags.put(_client(url), "keys", doc["id"], queueing)))
            except LlmgwError as e:  # the key exists: its secret is printed all the same
                err_console.print(f"[red]error:[/red] key/{doc['id']} was created but its priority was not set: {e}; "
                                  f"set it with `llmgw key update {doc['id']} --priority-class ...`", markup=True)
        print(doc["key"], flush=True)  # plain print: a script reads it, Rich could wrap it

    @key_app.command("update")
    @with_limit_flags
    def update(
        key_id: str = typer.Argument(..., help="The key's id, as `llmgw key list` shows it"),
        models: str | None = typer.Option(None, "--models", help="Comma-separated models it may use ('': all)"),
        rpm: int | None = typer.Option(None, "--rpm", min=0, help="Requests a minute [0: unlimited]"),
        tpm: int | None = typer.Option(None, "--tpm", min=0, help="Tokens a minute [0: unlimited]"),
        priority_class: str | None = priorityflags.class_option(),
        weight: float | None = priorityflags.weight_option(),
        url: str = url_opt,
        *, limits: dict[str, Any],
    ) -> None:
        """Change a key's models, rpm, tpm, budgets, priority class or weight (the last three: operators and
        admins); the rest stays."""
        body: dict[str, Any] = {"rpm": rpm, "tpm": tpm}
        if models is not None:
            body["models"] = [m.strip() for m in models.split(",") if m.strip()]
        if limits:
            body["limits"] = limits
        body = {k: v for k, v in body.items() if v is not None}
        queueing = priorityflags.body(priority_class, weight)
        if not body and not queueing:
            raise _fail("nothing to change: give --models, --rpm, --tpm, --priority-class, --weight or a limit such "
                        "as --tokens-per-day")
        try:
            if queueing:
                console.print(f"key/{key_id}: " + priorityflags.said(priorityflags.put(_client(url), "keys", key_id,
                                                                                       queueing)))
            if body:
                _, doc = _client(url).request("PATCH", f"/api/v1/keys/{key_id}", json=body)
                console.print(f"key/{key_id} updated: limits {limits_cell(doc['limits'])}")
        except LlmgwError as e:
            raise _fail(str(e)) from None

    @key_app.command("list")
    def list_(output: out.Format = typer.Option(out.Format.table, "-o", "--output",
                                                help="table, wide, json, yaml or name"),
              project: str = typer.Option("", "--project", help="Only this project's keys"),
              url: str = url_opt) -> None:
        """List the keys you may see (never their secrets); `llmgw get keys` sorts and watches too."""
        try:
            items = _client(url).get(f"/api/v1/keys?project={project}" if project else "/api/v1/keys")["items"]
            out.show(items, listing(), out.View(output=output))
        except LlmgwError as e:
            raise _fail(str(e)) from None

    @key_app.command("delete")
    def delete(key_id: str = typer.Argument(..., help="The key's id, as `llmgw key list` shows it"),
               url: str = url_opt) -> None:
        """Delete a key; the router refuses it within a second or so."""
        try:
            _client(url).request("DELETE", f"/api/v1/keys/{key_id}")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        console.print(f"key/{key_id} deleted")

    def switch(key_id: str, action: str, url: str | None) -> None:
        try:
            _client(url).request("POST", f"/api/v1/keys/{key_id}/{action}")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        console.print(f"key/{key_id} {action}d")

    @key_app.command("disable")
    def disable(key_id: str = typer.Argument(..., help="The key's id, as `llmgw key list` shows it"),
                url: str = url_opt) -> None:
        """Disable a key: the router refuses it within a second or so; `llmgw key enable` takes it back."""
        switch(key_id, "disable", url)

    @key_app.command("enable")
    def enable(key_id: str = typer.Argument(..., help="The key's id, as `llmgw key list` shows it"),
               url: str = url_opt) -> None:
        """Enable a disabled key again (its secret is unchanged)."""
        switch(key_id, "enable", url)
