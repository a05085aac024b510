"""``llmgw user ...`` and ``llmgw router-token ...``: accounts and routers' credentials (administrators only).

A new user's password, a reset one, and a router's token are printed once, on a line of their
own (``| tail -1`` takes it); the control plane keeps only hashes, so a lost one is replaced,
never shown again.
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import output as out
from llmgw.core import humane
from llmgw.core.errors import LlmgwError

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)
ROLES = ("admin", "operator", "viewer")


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", markup=True)
    return typer.Exit(1)


def _call(url: str | None, method: str, path: str, body: Any = None) -> Any:
    c = client_mod.Client(url or client_mod.default_url())
    try:
        return c.request(method, path, json=body)[1]
    except LlmgwError as e:
        raise _fail(str(e)) from None
    finally:
        c.close()


USERS = out.Listing("user", (
    out.Column("NAME", lambda u: u["name"]),
    out.Column("ROLE", lambda u: u["role"]),
    out.Column("SIGNS IN WITH", lambda u: "single sign-on" if u.get("source") == "sso" else "password"),
), name=lambda u: str(u["name"]))

ROUTERS = out.Listing("router", (
    out.Column("NAME", lambda r: r["name"]),
    out.Column("ID", lambda r: r["id"]),
    out.Column("LAST USED", lambda r: "never" if not r["last_used_at"] else humane.ago(r["last_used_at"], time.time())),
), name=lambda r: str(r["name"]))


def _show(items: list[dict[str, Any]], output: out.Format, listing: out.Listing) -> None:
    try:
        out.show(items, listing, out.View(output=output))
    except LlmgwError as e:
        raise _fail(str(e)) from None


def _role(role: str) -> str:
    if role not in ROLES:
        raise _fail(f"role {role!r}: one of {', '.join(ROLES)}")
    return role


def register(app: typer.Typer) -> None:
    """Adds ``user`` and ``router-token`` to ``app``."""
    user_app = typer.Typer(no_args_is_help=True, help="Users and their roles: admin, operator (models, nodes, "
                                                      "keys), viewer (read).")
    router_app = typer.Typer(no_args_is_help=True, help="Credentials for standalone routers (`llmgw router "
                                                        "--token-file`).")
    app.add_typer(user_app, name="user")
    app.add_typer(router_app, name="router-token")
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")
    output_opt = typer.Option(out.Format.table, "-o", "--output", help="table, wide, json, yaml or name")

    @user_app.command("create")
    def create(name: str, role: str = typer.Option(..., "--role", help="admin, operator or viewer"),
               url: str = url_opt) -> None:
        """Create a user; its generated password is printed this once."""
        doc = _call(url, "POST", "/api/v1/users", {"name": name, "role": _role(role)})
        err_console.print(f"user/{doc['name']} created with role {doc['role']}; its password, shown once:")
        typer.echo(doc["password"])

    @user_app.command("list")
    def list_(output: out.Format = output_opt, url: str = url_opt) -> None:
        """Users and their roles (`llmgw get users` sorts and watches too)."""
        items = _call(url, "GET", "/api/v1/users")["items"]
        _show(items, output, USERS)

    @user_app.command("delete")
    def delete(name: str, url: str = url_opt) -> None:
        """Delete a user and every token and session of theirs."""
        _call(url, "DELETE", f"/api/v1/users/{name}")
        console.print(f"user/{name} deleted")

    @user_app.command("set-role")
    def set_role(name: str, role: str, url: str = url_opt) -> None:
        """Change a user's role (from their next request)."""
        doc = _call(url, "PUT", f"/api/v1/users/{name}", {"role": _role(role)})
        console.print(f"user/{doc['name']} now has role {doc['role']}")

    @user_app.command("reset-password")
    def reset_password(name: str, url: str = url_opt) -> None:
        """Give a user a new generated password (printed once); their tokens and sessions end."""
        doc = _call(url, "PUT", f"/api/v1/users/{name}", {"reset_password": True})
        err_console.print(f"user/{doc['name']}: new password, shown once (their tokens and sessions ended):")
        typer.echo(doc["password"])

    @router_app.command("create")
    def router_create(name: str, url: str = url_opt) -> None:
        """Make a router's credential; the token is printed this once (put it in a file for --token-file)."""
        doc = _call(url, "POST", "/api/v1/routers", {"name": name})
        err_console.print(f"router/{doc['name']}: its token, shown once (`llmgw router --token-file FILE`, or "
                          "LLMGW_ROUTER_TOKEN):")
        typer.echo(doc["token"])

    @router_app.command("list")
    def router_list(output: out.Format = output_opt, url: str = url_opt) -> None:
        """Routers with a credential (never the secret)."""
        items = _call(url, "GET", "/api/v1/routers")["items"]
        _show(items, output, ROUTERS)

    @router_app.command("delete")
    def router_delete(name: str, url: str = url_opt) -> None:
        """Delete a router's credential; it is refused from its next request."""
        _call(url, "DELETE", f"/api/v1/routers/{name}")
        console.print(f"router/{name} deleted")
