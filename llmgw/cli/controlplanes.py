"""``llmgw get controlplanes`` (``controlplane``, ``cp``): every control plane, who leads, at which term, and where.

Plain aligned columns rather than a rich table: a table narrower than its terminal wraps the
addresses mid-word, and the list is what one pastes into a bug report or reads in a script.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import typer

from llmgw.cli import client as client_mod
from llmgw.core.errors import LlmgwError

COLUMNS = ("NAME", "ROLE", "TERM", "LEASE-AGE", "ADDRESS", "AGENTS", "VERSION")


class Output(enum.StrEnum):
    table = "table"
    json = "json"


def rows(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per control plane; this instance (the one answering) marked with ``*`` after its name."""
    out = []
    for cp in doc.get("controlplanes", []):
        leads = cp["role"] == "leader"
        out.append((cp["id"] + ("*" if cp["id"] == doc.get("self") else ""), cp["role"],
                    str(cp["term"]) if leads else "-",
                    f"{cp['lease_age_s']:.1f}s" if leads and cp["lease_age_s"] >= 0 else "-",
                    cp["http_url"] or "-", cp["agent_addr"] or "-", cp["version"] or "-"))
    return out


def render(doc: dict[str, Any]) -> str:
    """The table as text: a header, then the rows, each column as wide as its widest cell."""
    table = [COLUMNS, *rows(doc)]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    lines = ["   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in table]
    if len(table) == 1:
        lines.append("(none listed: this server keeps no leader lease)")
    return "\n".join(lines)


def register(get_app: typer.Typer) -> None:
    """Adds ``controlplanes`` (and its aliases) to the ``get`` group."""

    def get_controlplanes(output: Output = typer.Option(Output.table, "-o", "--output"),
                          url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default "
                                                  "http://127.0.0.1:8080]")) -> None:
        """Control planes: which leads (its term, its lease renewed how long ago), which stand by, where each serves."""
        try:
            doc = client_mod.Client(url or client_mod.default_url()).get("/api/v1/controlplanes")
        except LlmgwError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        typer.echo(json.dumps(doc, indent=2) if output is Output.json else render(doc))

    get_app.command("controlplanes")(get_controlplanes)
    get_app.command("controlplane", hidden=True)(get_controlplanes)
    get_app.command("cp", hidden=True)(get_controlplanes)
