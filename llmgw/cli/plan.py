"""``llmgw plan SOURCE``, ``llmgw catalog`` and what ``llmgw apply --dry-run`` prints: a deployment before it is made.

Each asks the control plane (``POST /api/v1/preview``, ``GET /api/v1/catalog``): the weights' metadata read
through the cluster's hub or mirror, the memory each engine needs, and the placer's dry run, with the reason
of every node the model would not land on. Printed as plain aligned columns, full values, nothing cut, so a
pipe reads what a terminal shows. ``llmgw plan SOURCE -o yaml`` prints only the model file it would apply:
``llmgw plan ORG/REPO -o yaml > m.yaml``, edit, ``llmgw apply -f m.yaml``.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any

import typer

from llmgw.cli import client as client_mod
from llmgw.core.errors import LlmgwError
from llmgw.core.units import format_bytes


class PlanOutput(enum.StrEnum):
    text = "text"
    json = "json"
    yaml = "yaml"  # the model file alone


def columns(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows aligned under ``header``, every value whole."""
    table = [list(header), *[list(r) for r in rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    return [indent + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in table]


def _count(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _size(n: int) -> str:
    return format_bytes(n) if n > 0 else "-"


def render(doc: dict[str, Any]) -> list[str]:
    """A preview as lines: metadata, memory per engine, placement with each node's reason, the model file."""
    out = [f"model/{doc['name']} on {doc['engine']} (dry run: nothing applied)"]
    meta = doc.get("metadata")
    if meta:
        out.append(f"source        {meta['source']} ({meta['origin']})")
        words = [f"format {meta['format'] or '?'}", f"architecture {meta['architecture'] or '?'}",
                 f"dtype {meta['dtype'] or '?'}", f"quantization {meta['quantization'] or 'none'}"]
        out.append("weights       " + ", ".join(words))
        shape = [f"{_count(meta['params'])} parameters" if meta["params"] else "parameters ?",
                 f"{meta['layers'] or '?'} layers", f"hidden {meta['hidden_size'] or '?'}",
                 f"{meta['heads'] or '?'} heads ({meta['kv_heads'] or '?'} KV)",
                 f"context {meta['context_length'] or '?'}", f"{_size(meta['size_bytes'])} on disk"]
        out.append("shape         " + ", ".join(shape))
        for name, size in meta.get("files", {}).items():
            out.append(f"  file        {name}  {_size(size)}")
    elif doc.get("metadata_problem"):
        out.append(f"metadata      not read: {doc['metadata_problem']}")
    if doc.get("memory"):
        ctx = doc["context"] or (meta or {}).get("context_length") or "the model's"
        out.append(f"memory for {doc['concurrency']} x {ctx} tokens of context (weights + KV cache + overhead):")
        out += columns(("ENGINE", "ON", "WEIGHTS", "KV CACHE", "TOTAL"),
                       [(m["engine"], "a GPU" if m["device"] == "gpu" else "CPU", _size(m["weights_bytes"]),
                         _size(m["kv_bytes"]), _size(m["total_bytes"]) if m["total_bytes"] else "unknown")
                        for m in doc["memory"]])
        out.append(f"engines that can run it: {', '.join(doc['engines'])}")
    p = doc["placement"]
    memory = f"; each needs {_size(p['memory_bytes'])}{' (estimated)' if p['memory_estimated'] else ''}" \
        if p["memory_bytes"] else ""
    out.append(f"placement: {p['placed']} of {p['wanted']} replicas placed{memory}")
    if p["message"]:
        out.append(f"  {p['message']}")
    rows = []
    for n in p["nodes"]:
        said = (f"lands here{' on GPUs ' + ','.join(map(str, n['gpus'])) if n['gpus'] else ''}" if n["replicas"]
                else "fits (the placer chose another node)" if n["fits"] else n["reason"])
        rows.append((n["node"], str(n["replicas"]), said))
    out += columns(("NODE", "REPLICAS", "WHY"), rows) if rows else ["  no node is registered"]
    return out


def _print(doc: dict[str, Any], output: PlanOutput, *, manifest_too: bool) -> None:
    if output is PlanOutput.json:
        typer.echo(json.dumps(doc, indent=2))
    elif output is PlanOutput.yaml:
        typer.echo(doc["manifest_yaml"], nl=False)
    else:
        typer.echo("\n".join(render(doc)))
        if manifest_too:
            typer.echo("model file it would apply (llmgw plan ... -o yaml writes it alone):")
            typer.echo("".join(f"  {line}\n" for line in doc["manifest_yaml"].splitlines()), nl=False)


def preview_manifest(client: client_mod.Client, manifest: dict[str, Any]) -> None:
    """What ``llmgw apply --dry-run`` prints for one model file."""
    _, doc = client.request("POST", "/api/v1/preview", json={"manifest": manifest})
    _print(doc, PlanOutput.text, manifest_too=False)


def register(app: typer.Typer, *, fail: Any) -> None:
    @app.command("plan")
    def plan(
        source: str = typer.Argument(..., help="ORG/REPO (a Hugging Face repository), hf://ORG/REPO, "
                                               "hf://ORG/REPO/FILE.gguf, mirror://NAME, or a path a node reports "
                                               "in its model_dirs"),
        engine: str = typer.Option("", "--engine", help="The engine to size and place it for [default: the first "
                                                        "that loads its format: llamacpp for GGUF, vllm else]"),
        context: int = typer.Option(0, "--context-length", "--ctx", min=0, help="Tokens of context per sequence "
                                    "(not --context: that one picks the CLI context, on every command) [default: the "
                                    "model's own]"),
        concurrency: int = typer.Option(1, "--concurrency", min=1, help="Sequences held at once"),
        replicas: int = typer.Option(1, "--replicas", min=0, help="Replicas to place"),
        name: str = typer.Option("", "--name", help="The model's name [default: from the source]"),
        output: PlanOutput = typer.Option(PlanOutput.text, "-o", "--output",
                                          help="text; json (the preview document); yaml (the model file alone)"),
        url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL]"),
    ) -> None:
        """What deploying SOURCE would take and where it would land: metadata, memory per engine, placement."""
        body = {"source": source, "engine": engine, "context": context, "concurrency": concurrency,
                "replicas": replicas, "name": name}
        try:
            _, doc = client_mod.Client(url or client_mod.default_url()).request("POST", "/api/v1/preview", json=body)
        except LlmgwError as e:
            raise fail(str(e)) from None
        _print(doc, output, manifest_too=True)

    @app.command("catalog")
    def catalog(
        output: str = typer.Option("text", "-o", "--output", help="text or json"),
        url: str = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL]"),
    ) -> None:
        """The model catalog to start from (`llmgw plan SOURCE` shows one's memory and placement)."""
        try:
            items = client_mod.Client(url or client_mod.default_url()).get("/api/v1/catalog")["items"]
        except LlmgwError as e:
            raise fail(str(e)) from None
        if output == "json":
            typer.echo(json.dumps(items, indent=2))
            return
        typer.echo("\n".join(columns(("NAME", "ENGINE", "SIZE", "LICENSE", "SOURCE"),
                                     [(i["name"], i["engine"], i["size"], i["license"], i["source"]) for i in items],
                                     indent="")))
