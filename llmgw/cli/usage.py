"""``llmgw usage``: metered usage summed per project, key, model, user, node or day, from ``GET /api/v1/usage``.

Three shapes: a table for people, ``-o json`` (the API's answer as it is) and ``-o csv`` (a header row, then
one row per group, plain numbers: what a spreadsheet or ``awk -F,`` reads). The window's start is rounded
down to the grain the server reads (minute, hour or day); the table's caption says which.
"""

from __future__ import annotations

import csv
import enum
import io
import json
import sys
import time
from typing import Any
from urllib.parse import urlencode

import typer

from llmgw.cli import client as client_mod
from llmgw.cli import output as out
from llmgw.core.errors import LlmgwError

#: The CSV's columns, in order: the API row's fields.
CSV_COLUMNS = ("group", "requests", "errors", "prompt_tokens", "cached_tokens", "completion_tokens", "total_tokens",
               "spend", "ttft_p50_ms", "ttft_p90_ms", "duration_ms_mean")
_GRAIN = {"m": "minute", "h": "hour", "d": "day"}


class By(enum.StrEnum):
    project = "project"
    key = "key"
    model = "model"
    user = "user"
    node = "node"
    day = "day"


class Output(enum.StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _n(x: float) -> str:
    return f"{int(x):,}"


def caption(doc: dict[str, Any]) -> str:
    """The window the table sums, said under it (on stderr: a script reading the rows sees only rows)."""
    since = time.strftime("%Y-%m-%d %H:%M", time.gmtime(doc["since"]))
    return f"since {since} UTC (read at {_GRAIN.get(doc['grain'], doc['grain'])} grain)"


def table(doc: dict[str, Any]) -> out.Table:
    """The answer as plain aligned columns: one row per group, then the totals."""
    t = out.Table((doc["by"].upper(), "REQUESTS", "ERRORS", "PROMPT", "CACHED", "COMPLETION", "SPEND",
                      "TTFT P50", "TTFT P90", "MEAN DURATION"))
    rows = doc["rows"]
    for r in rows:
        t.add_row(r["group"] or "-", _n(r["requests"]), _n(r["errors"]), _n(r["prompt_tokens"]),
                  _n(r["cached_tokens"]), _n(r["completion_tokens"]), f"{r['spend']:.2f}",
                  f"{r['ttft_p50_ms']:g} ms", f"{r['ttft_p90_ms']:g} ms", f"{r['duration_ms_mean']:.0f} ms")
    if len(rows) > 1:
        t.add_row("TOTAL", *(_n(sum(r[k] for r in rows)) for k in ("requests", "errors", "prompt_tokens",
                                                                   "cached_tokens", "completion_tokens")),
                  f"{sum(r['spend'] for r in rows):.2f}", "", "", "")
    return t


def to_csv(doc: dict[str, Any]) -> str:
    """A header row (``CSV_COLUMNS``, ``group`` named after ``by``) and one row per group."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([doc["by"], *CSV_COLUMNS[1:]])
    for r in doc["rows"]:
        w.writerow([r[c] for c in CSV_COLUMNS])
    return buf.getvalue()


def query(*, by: str, since: str, until: str, project: str, key: str, model: str) -> str:
    return "/api/v1/usage?" + urlencode({k: v for k, v in (("since", since), ("until", until), ("by", by),
                                                          ("project", project), ("key", key), ("model", model))
                                         if v})


def register(app: typer.Typer) -> None:
    """Adds ``usage`` to ``app``."""

    @app.command("usage")
    def usage(project: str = typer.Option("", "--project", help="Only this project"),
              key: str = typer.Option("", "--key", help="Only this key (its id)"),
              model: str = typer.Option("", "--model", help="Only this model"),
              by: By = typer.Option(By.project, "--by", help="Sum per project, key, model, user, node or day"),
              since: str = typer.Option("7d", "--since", help="A duration back from now (90m, 24h, 7d) or a UTC "
                                                               "date (2026-12-01)"),
              until: str = typer.Option("", "--until", help="The window's end, as --since (default: now)"),
              output: Output = typer.Option(Output.table, "-o", "--output", help="table, json or csv"),
              url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default "
                                                           f"{client_mod.DEFAULT_URL}]")) -> None:
        """Requests, tokens, spend and time to first token, summed per project (or key, model, user, node, day);
        you see the projects you belong to, an operator sees all."""
        try:
            doc = client_mod.Client(url or client_mod.default_url()).get(
                query(by=by.value, since=since, until=until, project=project, key=key, model=model))
        except LlmgwError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        if output is Output.json:
            print(json.dumps(doc, indent=2))
        elif output is Output.csv:
            sys.stdout.write(to_csv(doc))
        else:
            if not doc["rows"]:
                print("no usage in this window: no request was metered for what you may see", file=sys.stderr)
                return
            try:
                out.emit(table(doc).text())
            except BrokenPipeError:
                out.quiet_pipe()
                return
            print(caption(doc), file=sys.stderr)
