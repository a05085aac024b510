"""``llmgw login`` and ``llmgw logout``: a token for this user, saved in a named context.

The password is read from a prompt that does not echo, or with ``--password-stdin`` from the
first line of stdin (scripts); never from a flag, which every user of the machine can read
in ``ps``. The token is saved 0600 in ``$XDG_CONFIG_HOME/llmgw/credentials.json`` under a context
(``contexts``): ``--context NAME`` names it (alice@prod and bob@prod side by side), ``--url`` (repeatable,
or comma-separated) gives the cluster's control planes; the context logged in to becomes the current one.
"""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

import typer

from llmgw.cli import client as client_mod
from llmgw.cli import contexts, ssologin, trust
from llmgw.core.errors import LlmgwError


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def target(name: str | None, urls: list[str], creds: contexts.Credentials) -> tuple[str, list[str]]:
    """The context a login saves to and its URLs.

    Named: that context, with the URLs given, else its own, else the current context's (a second user of
    the same cluster), else the default. Not named: the current context when the URLs given are its (or
    none are given), else a context named by the first URL's host and port.
    """
    current = creds.contexts.get(creds.current)
    if name:
        mine = creds.contexts.get(name)
        return name, urls or (mine.urls if mine and mine.urls else None) or (current.urls if current else None) \
            or [contexts.normal(client_mod.default_url())]
    if current is not None and (not urls or urls[0] in current.urls):
        return current.name, urls or current.urls
    urls = urls or [contexts.normal(client_mod.default_url())]
    return contexts.name_for(urls[0]), urls


def register(app: typer.Typer) -> None:
    """Adds ``login`` and ``logout`` to ``app``."""
    url_opt = typer.Option([], "--url", help="Control plane URL; repeat it (or separate with commas) for a cluster's "
                           f"several control planes [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")
    context_opt = typer.Option(None, "--context", envvar=contexts.CONTEXT_ENV, help="The context to save the login "
                               "in (made if new, and made current) [default: the current context]")

    @app.command("login")
    def login(
        url: list[str] = url_opt,
        context: str = context_opt,
        username: str = typer.Option("admin", "--username", "-u", help="Who to log in as"),
        password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from stdin's "
                                            "first line instead of a prompt"),
        sso: bool = typer.Option(False, "--sso", help="Sign in through the cluster's identity provider (single "
                                 "sign-on): a code to enter on its page, in any browser"),
        ca_hash: str = typer.Option("", "--ca-hash", help="An https:// server's cluster CA hash (sha256:…, printed by "
                                    "`llmgw server` at start): pin it without asking"),
        ca_file: Path = typer.Option(None, "--ca-file", help="Trust this CA certificate (PEM) for the server: an "
                                     "operator's own CA for --tls-cert"),
    ) -> None:
        """Log in and save a token (valid 30 days) in a context: this cluster's URLs, this user."""
        try:
            given = contexts.split_urls(url or ([os.environ["LLMGW_URL"]] if os.environ.get("LLMGW_URL") else []))
            creds = contexts.read()
            name, urls = target(context.strip() if context else None, given, creds)
            known = creds.contexts[name].ca if name in creds.contexts and not (ca_hash or ca_file) else ""
            # Before the password: the server must be the one trusted (trust.for_login says how it is decided).
            ca = trust.for_login(urls, ca_hash=ca_hash, ca_file=ca_file, known=known,
                                 ask=trust.terminal_ask if sys.stdin.isatty() and not password_stdin else None)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        if sso:
            try:
                ssologin.sign_in(name, urls, echo=typer.echo, ca=ca)
            except LlmgwError as e:
                raise _fail(str(e).split(". Run `llmgw login")[0]) from None
            return
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            try:
                password = getpass.getpass(f"password for {username} at {urls[0]}: ")
            except (EOFError, KeyboardInterrupt):
                raise _fail("no password given") from None
        if not password:
            raise _fail("the password is empty")
        c = client_mod.Client(urls[0], token="", urls=urls, ca=ca)  # no old token; this context's control planes
        try:
            _, doc = c.request("POST", "/api/v1/login", json={"username": username, "password": password})
        except LlmgwError as e:
            raise _fail(str(e).split(". Run `llmgw login")[0]) from None
        finally:
            c.close()
        creds = contexts.read()  # again: another login may have written it while this one waited for a password
        creds.contexts[name] = contexts.Context(name, urls, doc["user"], doc["token"], ca)
        creds.current = name
        path = contexts.write(creds)
        typer.echo(f"logged in to {c.url} as {doc['user']} (role {doc['role']}); context {name} (current, "
                   f"control planes {', '.join(urls)}) saved in {path}")

    @app.command("logout")
    def logout(url: list[str] = url_opt, context: str = typer.Option(None, "--context", envvar=contexts.CONTEXT_ENV,
                                                                     help="The context to log out of "
                                                                     "[default: the current context]")) -> None:
        """End a context's saved token, on the server and here (the context and its URLs stay)."""
        try:
            creds = contexts.read()
            given = contexts.split_urls(url)
            if context:
                ctx = creds.contexts.get(context.strip())
                if ctx is None:
                    raise contexts.unknown(context.strip(), creds)
            else:
                ctx = contexts.for_url(creds, given[0]) if given else contexts.selected(creds)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        if ctx is None or not ctx.token:
            typer.echo(f"not logged in{f' (context {ctx.name})' if ctx else ''}")
            return
        c = client_mod.Client(ctx.urls[0] if ctx.urls else client_mod.DEFAULT_URL, token=ctx.token, urls=ctx.urls,
                              ca=ctx.ca)
        try:
            c.request("POST", "/api/v1/logout")
        except LlmgwError as e:  # already expired or deleted there: forgetting it here is all that is left
            typer.echo(f"the server did not end the token ({e}); forgetting it here", err=True)
        finally:
            c.close()
        creds = contexts.read()
        if ctx.name in creds.contexts:
            creds.contexts[ctx.name].token = ""
            contexts.write(creds)
        typer.echo(f"logged out of context {ctx.name} ({ctx.user or 'no user'} at {c.url})")
