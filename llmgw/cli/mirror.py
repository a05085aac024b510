"""``llmgw mirror`` (serve a directory of weights) and ``llmgw mirror add SOURCE --mirror URL`` (pre-load)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx
import typer
from rich.console import Console

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

TOKEN_ENV = "LLMGW_MIRROR_ADMIN_TOKEN"
UPSTREAM_TOKEN_ENV = "LLMGW_MIRROR_UPSTREAM_TOKEN"


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
    def serve(
        ctx: typer.Context,
        dir: Path = typer.Option(None, "--dir", help="The weights directory (hf/ORG/REPO/..., files/NAME/...)"),
        host: str = typer.Option("127.0.0.1", help="Address to listen on"),
        port: int = typer.Option(8090, min=0, max=65535, help="Port to listen on"),
        upstream: str = typer.Option("", help="Pull missing files through from this HF-compatible endpoint, "
                                              "e.g. https://huggingface.co \\[default: off]"),
        admin_token_file: Path = typer.Option(None, help=f"File holding the admin token for POST /admin/add "
                                                        f"\\[env {TOKEN_ENV}; default: admin API off]"),
        upstream_token_file: Path = typer.Option(None, help=f"File holding a token for the upstream "
                                                           f"\\[env {UPSTREAM_TOKEN_ENV}]"),
        tls_cert: Path = typer.Option(None, help="Serve HTTPS with this certificate (PEM)"),
        tls_key: Path = typer.Option(None, help="... and this key (PEM)"),
        log_level: str = typer.Option("info"),
    ) -> None:
        """Serve a directory of weights (run `llmgw mirror add --help` to pre-load one)."""
        if ctx.invoked_subcommand is not None:
            return
        from llmgw.mirror import server

        if dir is None:
            raise _fail("--dir is required: the directory to serve (created if missing)")
        if bool(tls_cert) != bool(tls_key):
            raise _fail("--tls-cert and --tls-key go together: give both, or neither for plain HTTP")
        if upstream and not upstream.startswith(("http://", "https://")):
            raise _fail(f"--upstream {upstream!r}: expected http(s)://HOST[:PORT], e.g. https://huggingface.co")
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)
        server.run(dir, host=host, port=port, upstream=upstream,
                   admin_token=_token(admin_token_file, TOKEN_ENV, "--admin-token-file"),
                   upstream_token=_token(upstream_token_file, UPSTREAM_TOKEN_ENV, "--upstream-token-file"),
                   tls_cert=str(tls_cert or ""), tls_key=str(tls_key or ""), log_level=log_level)

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
            r = httpx.post(mirror.rstrip("/") + "/admin/add", json={"source": source},
                           headers={"Authorization": f"Bearer {token}"}, timeout=None)
        except httpx.HTTPError as e:
            raise _fail(f"cannot reach the mirror at {mirror}: {e!r}") from None
        try:
            doc = r.json()
        except ValueError:
            doc = {"error": r.text[:300]}
        if r.status_code != 200:
            raise _fail(f"the mirror refused ({r.status_code}): {doc.get('error', doc)}")
        console.print(f"{doc['repo']}@{doc['revision']} = {doc['sha']}: {doc['files']} files, "
                      f"{doc['fetched']} fetched from upstream, {doc['bytes']} bytes")
