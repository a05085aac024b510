"""``llmgw login`` and ``llmgw logout``: a token for this user, saved per control-plane URL.

The password is read from a prompt that does not echo, or with ``--password-stdin`` from the
first line of stdin (scripts); never from a flag, which every user of the machine can read
in ``ps``. The token is saved 0600 in ``$XDG_CONFIG_HOME/llmgw/credentials.json``
(``client.save_token``) and sent by every later command to that URL.
"""

from __future__ import annotations

import getpass
import sys

import typer

from llmgw.cli import client as client_mod
from llmgw.core.errors import LlmgwError


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Adds ``login`` and ``logout`` to ``app``."""
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")

    @app.command("login")
    def login(
        url: str = url_opt,
        username: str = typer.Option("admin", "--username", "-u", help="Who to log in as"),
        password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from stdin's "
                                            "first line instead of a prompt"),
    ) -> None:
        """Log in and save a token (valid 30 days) for this control plane."""
        target = (url or client_mod.default_url()).rstrip("/")
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            try:
                password = getpass.getpass(f"password for {username} at {target}: ")
            except (EOFError, KeyboardInterrupt):
                raise _fail("no password given") from None
        if not password:
            raise _fail("the password is empty")
        c = client_mod.Client(target, token="")  # a login sends no old token
        try:
            _, doc = c.request("POST", "/api/v1/login", json={"username": username, "password": password})
        except LlmgwError as e:
            raise _fail(str(e).split(". Run `llmgw login")[0]) from None
        finally:
            c.close()
        path = client_mod.save_token(target, doc["token"], user=doc["user"])
        typer.echo(f"logged in to {target} as {doc['user']} (role {doc['role']}); token saved in {path}")

    @app.command("logout")
    def logout(url: str = url_opt) -> None:
        """End this control plane's saved token, on the server and here."""
        target = (url or client_mod.default_url()).rstrip("/")
        token = client_mod.saved_token(target)
        if not token:
            typer.echo(f"not logged in to {target}")
            return
        c = client_mod.Client(target, token=token)
        try:
            c.request("POST", "/api/v1/logout")
        except LlmgwError as e:  # already expired or deleted there: forgetting it here is all that is left
            typer.echo(f"the server did not end the token ({e}); forgetting it here", err=True)
        finally:
            c.close()
        client_mod.save_token(target, "", user="")
        typer.echo(f"logged out of {target}")
