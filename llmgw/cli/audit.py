"""``llmgw audit [-f]``: the control plane's audit log as a table, oldest first; ``-f`` keeps printing new rows."""

from __future__ import annotations

import sys
import time
from typing import Any

import typer

from llmgw.cli import client as client_mod
from llmgw.cli import output
from llmgw.core.errors import LlmgwError

FOLLOW_INTERVAL_S = 1.0
COLUMNS = ("TIME", "ACTOR", "ACTION", "OBJECT", "OUTCOME", "DETAIL")


def row(e: dict[str, Any]) -> tuple[str, ...]:
    """One entry as the table's cells: local time to the second, and ``-`` for an empty detail."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(e["at"])))
    return (at, str(e["actor"]), str(e["action"]), str(e["object"]), str(e["outcome"]), str(e["detail"]) or "-")


def rows_text(items: list[dict[str, Any]], widths: list[int], *, header: bool = True) -> str:
    """The entries as plain aligned columns, whole values; ``widths``, set by the first batch, kept for the next
    (a wider cell later pushes its line's later cells right, never wraps)."""
    rows = [row(e) for e in items]
    if not widths:
        widths[:] = output.widths_of(rows, [len(c) for c in COLUMNS])
    return "".join(output.line_of(r, widths) + "\n" for r in ([COLUMNS] if header else []) + rows)


def register(app: typer.Typer) -> None:
    """Adds ``audit`` to ``app``."""

    @app.command("audit")
    def audit(follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new entries (every second)"),
              lines: int = typer.Option(500, "-n", "--lines", min=1, max=10_000, help="Entries asked for per request"),
              url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default "
                                                           f"{client_mod.DEFAULT_URL}]")) -> None:
        """Who changed what and when: applies, deletes, cordons, drains, keys; done, refused or failed."""
        c = client_mod.Client(url or client_mod.default_url())
        since, shown, widths = 0, False, list[int]()
        try:
            while True:
                items = c.get(f"/api/v1/audit?since={since}&limit={lines}")["items"]
                if items:
                    # The header once; followed rows come as headerless tables under it.
                    output.emit(rows_text(items, widths, header=not shown))
                    shown = True
                    since = max(int(e["id"]) for e in items)
                if len(items) == lines:  # a full page: more are waiting, ask again at once
                    continue
                if not follow:
                    if not shown:
                        print("no audit entries yet: nothing has been changed through the API", file=sys.stderr)
                    return
                time.sleep(FOLLOW_INTERVAL_S)
        except KeyboardInterrupt:
            return
        except BrokenPipeError:
            output.quiet_pipe()
        except LlmgwError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
