"""``--priority-class`` and ``--weight`` (issue 32) for ``llmgw key create|update`` and ``llmgw project
create|set-priority``, and ``llmgw priorities``: what each key and project queues as when a model is busy.

They go to ``PUT /api/v1/keys/{id}/priority`` / ``PUT /api/v1/projects/{name}/priority`` (operators and admins);
the classes are the cluster setting ``priority_classes`` (``llmgw settings set priority_classes ...``).
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import output as out

console = Console(soft_wrap=True)

CLASS_HELP = ("Priority class when a model is busy: interactive, batch or one of the cluster's priority_classes "
              "(operators and admins; '' unsets: the project's, else interactive)")
WEIGHT_HELP = "Share within its class relative to the other projects' (0.01-10000; 0 unsets: the project's, else 1)"


def class_option() -> Any:
    return typer.Option(None, "--priority-class", help=CLASS_HELP)


def weight_option() -> Any:
    return typer.Option(None, "--weight", help=WEIGHT_HELP)


def body(priority_class: str | None, weight: float | None) -> dict[str, Any]:
    """The PUT body for the flags given; {} when neither was."""
    doc: dict[str, Any] = {}
    if priority_class is not None:
        doc["priority_class"] = priority_class.strip()
    if weight is not None:
        doc["weight"] = weight
    return doc


def put(client: client_mod.Client, kind: str, name: str, change: dict[str, Any]) -> dict[str, Any]:
    """Sets ``kind`` (keys or projects) ``name``'s class and weight; the answer (raises LlmgwError)."""
    return client.request("PUT", f"/api/v1/{kind}/{name}/priority", json=change)[1]  # type: ignore[no-any-return]


def said(doc: dict[str, Any]) -> str:
    return (f"priority class {doc['priority_class'] or '(its project’s, else interactive)'}, "
            f"weight {doc['weight'] or '(its project’s, else 1)'}")


LISTING = out.Listing("priority", (
    out.Column("KIND", lambda p: p["kind"]),
    out.Column("NAME", lambda p: p["name"]),
    out.Column("CLASS", lambda p: p["priority_class"] or "-"),
    out.Column("WEIGHT", lambda p: f"{p['weight']:g}" if p["weight"] else "-"),
), name=lambda p: f"{p['kind']}/{p['name']}")


def register(app: typer.Typer) -> None:
    """Adds ``priorities`` to ``app``."""
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")

    @app.command("priorities")
    def priorities(output: out.Format = typer.Option(out.Format.table, "-o", "--output",
                                                     help="table, wide, json, yaml or name"),
                   url: str = url_opt) -> None:
        """The priority classes (highest first) and the keys and projects given a class or a weight."""
        from llmgw.cli.keys import _fail
        from llmgw.core.errors import LlmgwError

        try:
            doc = client_mod.Client(url or client_mod.default_url()).get("/api/v1/priorities")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        console.print(f"classes (highest first): {', '.join(doc['classes'])}", markup=False)
        rows = [{"kind": "key", **k} for k in doc["keys"]] + [{"kind": "project", **p} for p in doc["projects"]]
        out.show(rows, LISTING, out.View(output=output))
