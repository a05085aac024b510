"""``llmgw version``: this CLI's version and, when a control plane answers, each control plane's, agent's and
router's (the routers that report to it now; a control plane before 0.2.0 lists none).

Side by side, each marked when it differs from the control plane's, so a skew shows before it bites. A
control plane that cannot be reached (none running, not logged in) leaves only the CLI's line and says why.
"""

from __future__ import annotations

from typing import Any

import typer

from llmgw.cli import client as client_mod
from llmgw.core.errors import LlmgwError
from llmgw.core.version import version


def lines(cli: str, controlplanes: dict[str, Any] | None, nodes: list[dict[str, Any]] | None,
          routers: list[dict[str, Any]] | None = None) -> list[str]:
    """The rows ``llmgw version`` prints: the CLI, the control planes, the agents, the routers; a version other
    than the control plane's marked ``(differs from the control plane's X)``."""
    rows = [("cli", "", cli)]
    reference = ""
    for cp in (controlplanes or {}).get("controlplanes", []):
        rows.append(("control plane", str(cp.get("id", "")), str(cp.get("version") or "-")))
        if cp.get("role") == "leader" or not reference:
            reference = str(cp.get("version") or "")
    for node in nodes or []:
        rows.append(("agent", str(node.get("id", "")), str(node.get("agent_version") or "-")))
    for r in routers or []:
        rows.append(("router", str(r.get("id", "")), str(r.get("version") or "-")))
    width = max(len(f"{kind} {name}".strip()) for kind, name, _ in rows)
    out = []
    for kind, name, said in rows:
        mark = f"   (differs from the control plane's {reference})" if reference and said not in (reference, "-") \
            else ""
        out.append(f"{f'{kind} {name}'.strip():<{width}}   {said}{mark}")
    return out


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version_cmd(url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default: the "
                                            "current context's]")) -> None:
        """This CLI's version, and each control plane's, agent's and router's when one answers."""
        cps: dict[str, Any] | None = None
        nodes: list[dict[str, Any]] | None = None
        routers: list[dict[str, Any]] | None = None
        why = ""
        c = client_mod.Client(url or client_mod.default_url(), timeout=10)
        try:
            cps = c.get("/api/v1/controlplanes")
            nodes = list(c.get("/api/v1/nodes")["items"])
            try:
                routers = list(c.get("/api/v1/router/versions")["routers"])
            except LlmgwError:  # a control plane before 0.2.0 has no such list; the rest is said all the same
                routers = None
        except LlmgwError as e:
            why = str(e)
        finally:
            c.close()
        for line in lines(version(), cps, nodes, routers):
            typer.echo(line)
        if why:
            typer.echo(f"(no control plane's version: {why})", err=True)
