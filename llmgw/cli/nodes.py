"""``llmgw node revoke NODE``, ``llmgw node certificates NODE`` (a node's certificates) and ``llmgw node upgrade``
(its agent's llmgw release, ``nodeupgrade``), over the REST API."""

from __future__ import annotations

from urllib.parse import quote

import typer

from llmgw.cli import client as client_mod
from llmgw.cli import nodeupgrade, output
from llmgw.core import humane
from llmgw.core.errors import LlmgwError

UrlOpt = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default http://127.0.0.1:8080]")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _when(ts: float | None) -> str:
    return humane.utc(ts)


def register(app: typer.Typer) -> None:
    """Adds the ``node`` group to ``app``."""
    node_app = typer.Typer(no_args_is_help=True, help="A node's certificates (list them, revoke them) and its agent's "
                                                      "upgrade.")
    app.add_typer(node_app, name="node")
    nodeupgrade.register(node_app, url_opt=UrlOpt, fail=_fail)

    @node_app.command("revoke")
    def revoke(node: str, url: str = UrlOpt) -> None:
        """Refuse NODE's certificates from now on and close its stream; it comes back only by joining again."""
        try:
            _, doc = client_mod.Client(url or client_mod.default_url()).request(
                "POST", f"/api/v1/nodes/{quote(node, safe='')}/revoke")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        typer.echo(f"node/{node} revoked ({doc['revoked']} certificate(s)"
                   f"{', its stream closed' if doc.get('disconnected') else ''}); to bring it back, move its "
                   "state directory's pki/ aside and join it again with a new token")

    @node_app.command("certificates")
    def certificates(node: str, url: str = UrlOpt) -> None:
        """NODE's certificates: serial, issued, expires, revoked."""
        try:
            items = client_mod.Client(url or client_mod.default_url()).get(
                f"/api/v1/nodes/{quote(node, safe='')}/certificates")["items"]
        except LlmgwError as e:
            raise _fail(str(e)) from None
        t = output.Table(("SERIAL", "ISSUED", "EXPIRES", "REVOKED"))
        for c in items:
            t.add_row(c["serial"], _when(c["issued_at"]), _when(c["not_after"]), _when(c["revoked_at"]))
        output.emit(t.text())
