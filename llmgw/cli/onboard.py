"""``llmgw init`` and ``llmgw token create``: local commands on the control plane host, reading its data directory.

They do not go through the REST API: init runs before any server, and a join token is made by whoever can
read the CA's directory (the same person who could sign a node certificate by hand). Their heavy imports
(cryptography, argon2, the store) happen inside the commands, so `llmgw get` does not wait for them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
                                                        f"first --host given to init, port {JOIN_PORT}]"),
        data_dir: Path = typer.Option(None, "--data-dir", help=dir_help),
        database: str = typer.Option("", "--database", envvar="LLMGW_DATABASE", help=db_help),
    ) -> None:
        """Make a join token and print the `llmgw agent join` command that uses it."""
        from llmgw.cli import client as client_mod
        from llmgw.control import datadir, tokens
        from llmgw.core import pki

        d = data_dir or default_data_dir()
        try:
            ttl_s = units.parse_duration(ttl)
        except ValueError as e:
            raise _fail(f"--ttl: {e}") from None
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


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
