"""``llmgw get controlplanes`` (``controlplane``, ``cp``): every control plane, who leads, at which term, and where.

Laid out by ``cli.output`` (plain aligned columns, whole addresses); ``-o json|yaml`` print the REST document as it
came (with ``self``, the instance that answered), not only its list.
"""

from __future__ import annotations

import json
from typing import Any

import typer
import yaml

from llmgw.cli import getcmds
from llmgw.cli import output as out
from llmgw.core.errors import LlmgwError

SELF_KEY = "_self"


def _name(cp: dict[str, Any]) -> str:
    return str(cp["id"]) + ("*" if cp.get(SELF_KEY) else "")


def _leads(cp: dict[str, Any]) -> bool:
    return bool(cp["role"] == "leader")


CONTROLPLANES = out.Listing("controlplane", (
    out.Column("NAME", _name),
    out.Column("ROLE", lambda cp: cp["role"]),
    out.Column("TERM", lambda cp: str(cp["term"]) if _leads(cp) else "-"),
    out.Column("LEASE-AGE", lambda cp: f"{cp['lease_age_s']:.1f}s" if _leads(cp) and cp["lease_age_s"] >= 0 else "-"),
    out.Column("ADDRESS", lambda cp: cp["http_url"] or "-"),
    out.Column("AGENTS", lambda cp: cp["agent_addr"] or "-"),
    out.Column("VERSION", lambda cp: cp["version"] or "-"),
), name=lambda cp: str(cp["id"]))


def items_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One item per control plane; the one answering marked (``*`` after its name in the table)."""
    return [{**cp, SELF_KEY: cp["id"] == doc.get("self")} for cp in doc.get("controlplanes", [])]


def register(get_app: typer.Typer) -> None:
    """Adds ``controlplanes`` (and its aliases) to the ``get`` group."""

    def get_controlplanes(output: out.Format = getcmds.OUTPUT_OPT, no_headers: bool = getcmds.NO_HEADERS_OPT,
                          sort_by: str = getcmds.SORT_OPT, watching: bool = getcmds.WATCH_OPT,
                          url: str = getcmds.URL_OPT) -> None:
        """Control planes: which leads (its term, its lease renewed how long ago), which stand by, where each serves."""
        flags = getcmds.Flags(out.View(output=output, headers=not no_headers, sort_by=sort_by), watching, url)
        if output in (out.Format.json, out.Format.yaml) and not watching:
            try:
                doc = flags.client().get("/api/v1/controlplanes")
            except LlmgwError as e:
                typer.echo(f"error: {e}", err=True)
                raise typer.Exit(1) from None
            out.emit(json.dumps(doc, indent=2) + "\n" if output is out.Format.json
                     else yaml.safe_dump(doc, sort_keys=False))
            return
        getcmds.run(CONTROLPLANES, lambda c: items_of(c.get("/api/v1/controlplanes")), flags,
                    empty="(none listed: this server keeps no leader lease)")

    get_app.command("controlplanes")(get_controlplanes)
    get_app.command("controlplane", hidden=True)(get_controlplanes)
    get_app.command("cp", hidden=True)(get_controlplanes)
