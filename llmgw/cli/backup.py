"""``llmgw backup FILE`` and ``llmgw restore FILE --data-dir D``: local commands on the control plane's machine.

They read (or write) the data directory and the store as ``llmgw server`` does, not the REST API: a backup
holds the cluster CA's key, which no API gives out. ``backup`` works while the server runs.

The passphrase is never a flag (an argv is readable by every user of the machine): it comes from
``LLMGW_BACKUP_PASSPHRASE``, from ``--passphrase-file`` (its first line), or from a prompt on a terminal
(twice when making a backup, so a typo does not make a backup nobody can open).
"""

from __future__ import annotations

import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path

import typer

from llmgw.core.errors import LlmgwError

PASSPHRASE_ENV = "LLMGW_BACKUP_PASSPHRASE"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def passphrase(file: Path | None, *, confirm: bool) -> str:
    """The passphrase: ``--passphrase-file``, else LLMGW_BACKUP_PASSPHRASE, else asked on the terminal."""
    from llmgw.control.backup import sealed

    if file is not None:
        return sealed.read_passphrase_file(file, "--passphrase-file")
    given = os.environ.get(PASSPHRASE_ENV, "")
    if given:
        return given
    if not sys.stdin.isatty():
        raise LlmgwError(f"no backup passphrase: set {PASSPHRASE_ENV}, or give --passphrase-file FILE, or run on a "
                         "terminal to be asked (it is never a command-line argument)")
    first = getpass.getpass("backup passphrase: ")
    if confirm and getpass.getpass("again: ") != first:
        raise LlmgwError("the two passphrases differ; nothing was written. Run it again")
    return first


def register(app: typer.Typer, *, default_data_dir: Callable[[], Path]) -> None:
    """Adds ``backup`` and ``restore`` to ``app``."""
    db_help = ("The store's database URL when the server runs with --database (PostgreSQL) [env LLMGW_DATABASE; "
               "default: the one the data directory remembers, else SQLite in it]")
    pass_help = (f"A file whose first line is the backup passphrase [default: {PASSPHRASE_ENV}, else asked on the "
                 "terminal]")

    @app.command("backup")
    def backup(
        file: Path = typer.Argument(..., help="The backup file to write (mode 0600; refused if it exists)"),
        data_dir: Path = typer.Option(None, "--data-dir", help="The control plane's data directory "
                                      "[default $XDG_DATA_HOME/llmgw]"),
        database: str = typer.Option("", "--database", envvar="LLMGW_DATABASE", help=db_help),
        passphrase_file: Path = typer.Option(None, "--passphrase-file", help=pass_help),
        force: bool = typer.Option(False, "--force", help="Replace FILE if it exists"),
    ) -> None:
        """Back up the cluster (store, cluster CA, data directory) into one encrypted file; works while it runs."""
        from llmgw.control.backup import archive

        try:
            made = archive.make(file, passphrase(passphrase_file, confirm=True), data_dir=data_dir or
                                default_data_dir(), database=database, force=force)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        typer.echo(f"backed up the cluster (CA {made.ca_hash}, {made.kind} store) to {made.path}: {made.size} bytes, "
                   "encrypted; keep the passphrase: without it nobody can restore this file")

    @app.command("restore")
    def restore(
        file: Path = typer.Argument(..., help="A file `llmgw backup` wrote"),
        data_dir: Path = typer.Option(..., "--data-dir", help="The new control plane's data directory (new or "
                                      "empty)"),
        database: str = typer.Option("", "--database", envvar="LLMGW_DATABASE", help="For a PostgreSQL "
                                     "backup: an empty database to restore the store into (pg_restore)"),
        passphrase_file: Path = typer.Option(None, "--passphrase-file", help=pass_help),
    ) -> None:
        """Restore a backup into a new data directory; then `llmgw server --data-dir D` is the same cluster."""
        from llmgw.control.backup import archive

        try:
            done = archive.restore(file, passphrase(passphrase_file, confirm=False), data_dir=data_dir,
                                   database=database)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        typer.echo(f"restored the cluster (CA {done.ca_hash}, {done.kind} store, backed up by llmgw {done.made_by}) "
                   f"into {done.data_dir}")
        typer.echo(f"start it with `llmgw server --data-dir {done.data_dir}` and the flags it ran with, reachable at "
                   "the address its agents dial (they reconnect with their certificates; engines keep running)")
