"""``llmgw init`` and ``llmgw token create``.

init is local: it runs before any server, on the control plane's host. ``token create`` is a REST call
(``POST /api/v1/tokens``, administrators only) from anywhere a logged-in admin is, and prints the server's
own join command: its advertised host and the join port it really listens on. With ``--data-dir`` (or
``--database``) it stays the host-local bootstrap, before anyone has logged in: a token is made straight
in the store by whoever can read the CA's directory (the same person who could sign a node certificate
by hand). Their heavy imports (cryptography, argon2, the store) happen inside the commands, so `llmgw
get` does not wait for them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from llmgw.core import units
from llmgw.core.errors import LlmgwError

#: The join port `llmgw server` listens on unless told otherwise (TLS that authenticates the server only;
#: the agent port, 8081, needs the certificate the join gives).
JOIN_PORT = 8082


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def register(app: typer.Typer, *, default_data_dir: Callable[[], Path]) -> None:
    """Adds ``init`` and ``token create`` to ``app``."""
    dir_help = "The control plane's data directory [default $XDG_DATA_HOME/llmgw]"
    db_help = ("The store's database URL when the server runs with --database (PostgreSQL) [env LLMGW_DATABASE; "
               "default: SQLite in the data directory]")

    @app.command("init")
    def init(
        data_dir: Path = typer.Option(None, "--data-dir", help=dir_help),
        host: list[str] = typer.Option([], "--host", help="A name or address nodes reach this server by, put in "
                                                          "its certificate (repeatable; localhost, 127.0.0.1 "
                                                          "and ::1 are always in)"),
        database: str = typer.Option("", "--database", envvar="LLMGW_DATABASE", help=db_help),
        ca_from: Path = typer.Option(None, "--ca-from", help="Another control plane of this cluster: a directory "
                                     "holding the first one's ca.crt and ca.key (copied from its data directory's "
                                     "pki/), so agents trust both; the database's users are kept"),
    ) -> None:
        """Make the cluster CA, the server's certificate and the first administrator, once."""
        from llmgw.control import datadir  # here: every other command would pay for cryptography and argon2

        try:
            done = datadir.init(data_dir or default_data_dir(), hosts=host, database=database, ca_from=ca_from)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        typer.echo(f"initialised {done.data_dir}")
        typer.echo(f"cluster CA: {done.ca_hash}")
        if not done.admin_password:
            typer.echo("another control plane of the cluster in this database: its users are kept")
            return
        typer.echo("administrator: admin")
        # The one place the password exists outside memory: this terminal. Not logged, not stored.
        typer.echo(f"password (shown once, not stored; keep it now): {done.admin_password}")

    token_app = typer.Typer(no_args_is_help=True, help="Bootstrap tokens for `llmgw agent join`.")
    app.add_typer(token_app, name="token")

    @token_app.command("create")
    def create(
        ttl: str = typer.Option("1h", "--ttl", help="How long the token is valid, e.g. 30m, 1h, 24h"),
        uses: int = typer.Option(1, "--uses", min=1, help="How many nodes may join with it"),
        node: str = typer.Option("", "--node", help="The node id a node joining with it gets [default: its own]"),
        server: str = typer.Option("", "--server", help="HOST:PORT nodes reach the join port at [default: the "
                                                        "server's advertised join address; with --data-dir, the "
                                                        f"first --host given to init, port {JOIN_PORT}]"),
        url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL; the login's]"),
        data_dir: Path = typer.Option(None, "--data-dir", help="On the control plane's host, its data directory: "
                                      "the token is made in its store, without a login (not logged in, "
                                      "$XDG_DATA_HOME/llmgw when it is initialised)"),
        database: str = typer.Option("", "--database", envvar="LLMGW_DATABASE", help=db_help),
    ) -> None:
        """Make a join token and print the `llmgw agent join` command that uses it (an administrator's login,
        or on the control plane's host --data-dir)."""
        from llmgw.cli import client as client_mod
        from llmgw.control import datadir, tokens
        from llmgw.core import pki

        try:
            ttl_s = units.parse_duration(ttl)
        except ValueError as e:
            raise _fail(f"--ttl: {e}") from None
        if data_dir is None and not database:
            c = client_mod.Client(url or client_mod.default_url())
            # Logged in (or told where): the server makes it. Not logged in, on the host of an initialised data
            # directory: the local bootstrap, as before there were logins.
            if c.token or url or not datadir.is_initialised(default_data_dir()):
                _create_over_rest(c, ttl_s=ttl_s, uses=uses, node=node, server=server)
                return
            c.close()
        d = data_dir or default_data_dir()
        try:
            digest = pki.ca_hash(datadir.read_ca(d).cert_pem)
            address = server or f"{_bracket(datadir.server_names(d)[0])}:{JOIN_PORT}"
            store = datadir.open_store(d, database)
            try:
                token_id, secret = tokens.create_token(store, ttl_s=ttl_s, uses=uses, node_name=node)
                # Local, not through the REST API, so recorded here; the id is the token's public half.
                store.record_audit(actor=f"{client_mod.local_actor() or 'unknown'}@local", action="token create",
                                   object=f"token/{token_id}", outcome="ok",
                                   detail=f"ttl {ttl}, uses {uses}" + (f", node {node}" if node else ""))
            finally:
                store.close()
        except LlmgwError as e:
            raise _fail(str(e)) from None
        typer.echo(f"llmgw agent join --server {address} --token {token_id}.{secret} --ca-hash {digest}")


def _create_over_rest(c: Any, *, ttl_s: float, uses: int, node: str, server: str) -> None:
    """``POST /api/v1/tokens`` with ``c`` (a ``cli.client.Client``); prints the join command it answers."""
    try:
        _, doc = c.request("POST", "/api/v1/tokens", json={"ttl_s": ttl_s, "uses": uses, "node": node})
    except LlmgwError as e:
        raise _fail(f"{e} (on the control plane's host, `llmgw token create --data-dir DIR` needs no login)") from None
    finally:
        c.close()
    if server:
        typer.echo(f"llmgw agent join --server {server} --token {doc['token']} --ca-hash {doc['ca_hash']}")
    else:
        typer.echo(doc["command"])


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
