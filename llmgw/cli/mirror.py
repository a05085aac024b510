"""``llmgw mirror`` (serve a directory of weights) and ``llmgw mirror add SOURCE --mirror URL`` (pre-load)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import settingsflags
from llmgw.core.errors import LlmgwError
from llmgw.mirror.settings import TOKEN_ENV, UPSTREAM_TOKEN_ENV, MirrorSettings

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)



def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    return typer.Exit(1)


def _token(path: Path | None, env: str, flag: str) -> str:
    """A secret from a file (never argv, where `ps` shows it to every user) or the environment."""
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as e:
            raise _fail(f"{flag} {path}: cannot read it ({e.strerror})") from None
        if not token:
            raise _fail(f"{flag} {path} is empty: put the token on its first line")
        return token
    return os.environ.get(env, "").strip()


def register(app: typer.Typer) -> None:
    """Adds ``mirror`` (serve) and ``mirror add`` to ``app``."""
    mirror_app = typer.Typer(help="A directory of weights served over HTTP (mirror:// and a Hugging Face "
                                  "compatible endpoint for hf://), optionally pulling through from an upstream.")
    app.add_typer(mirror_app, name="mirror")

    @mirror_app.callback(invoke_without_command=True)
    @settingsflags.options(MirrorSettings, fail=_fail, group=True)
    def serve(settings: MirrorSettings) -> None:
        """Serve a directory of weights (run `llmgw mirror add --help` to pre-load one)."""
        from llmgw.mirror import server

        assert settings.dir is not None   # MirrorSettings refuses a missing --dir
        logging.basicConfig(level=settings.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
        server.run(settings.dir, host=settings.host, port=settings.port, upstream=settings.upstream,
                   admin_token=_token(settings.admin_token_file, TOKEN_ENV, "--admin-token-file"),
                   upstream_token=_token(settings.upstream_token_file, UPSTREAM_TOKEN_ENV, "--upstream-token-file"),
                   tls_cert=str(settings.tls_cert or ""), tls_key=str(settings.tls_key or ""),
                   log_level=settings.log_level)

    @mirror_app.command("add")
    def add(
        source: str = typer.Argument(..., help="hf://ORG/REPO, optionally with @REVISION and /PATH (a file or folder)"),
        mirror: str = typer.Option(..., "--mirror", help="The mirror's URL, e.g. http://mirror:8090"),
        admin_token_file: Path = typer.Option(None, help=f"File holding the mirror's admin token "
                                                                 f"\\[env {TOKEN_ENV}]"),
    ) -> None:
        """Pre-load a repository revision into a mirror (it fetches from its upstream what it lacks)."""
        token = _token(admin_token_file, TOKEN_ENV, "--admin-token-file")
        if not token:
            raise _fail(f"no admin token: pass --admin-token-file FILE or set {TOKEN_ENV}")
        try:
            # No timeout: the mirror answers when every file is on its disk, which for 100 GB takes a while.
            # A server's own /mirror: verified with the CA its context pinned (`llmgw login`), else the system's.
            parts = urlsplit(mirror)
            r = httpx.post(mirror.rstrip("/") + "/admin/add", json={"source": source},
                           headers={"Authorization": f"Bearer {token}"}, timeout=None,
                           verify=client_mod.verify_for(f"{parts.scheme}://{parts.netloc}"))
        except httpx.HTTPError as e:
            raise _fail(f"cannot reach the mirror at {mirror}: {e!r}") from None
        except LlmgwError as e:  # the saved contexts could not be read
            raise _fail(str(e)) from None
        try:
            doc = r.json()
        except ValueError:
            doc = {"error": r.text[:300]}
        if r.status_code != 200:
            raise _fail(f"the mirror refused ({r.status_code}): {doc.get('error', doc)}")
        console.print(f"{doc['repo']}@{doc['revision']} = {doc['sha']}: {doc['files']} files, "
                      f"{doc['fetched']} fetched from upstream, {doc['bytes']} bytes")
