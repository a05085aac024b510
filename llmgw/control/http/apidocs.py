"""``/api/docs``: the REST API's reference, one HTML page made here from the OpenAPI document, no script.

FastAPI's own docs page is Swagger UI, whose JavaScript and CSS it loads from a CDN (cdn.jsdelivr.net):
on a cluster without Internet access (many are; the machine this was built on is) it is a blank page, and
behind the API's authentication a browser got 401 for it, so the ``docs:`` link `make up` prints led
nowhere (issue 24). This page is rendered on the server from ``app.openapi()``: every operation, its
parameters and its summary, and it needs nothing from outside. Like ``/api/openapi.json`` it holds no
secret (the API's shape is in the source), so both are served without a credential
(``auth.principals.required``); every call the page describes still needs one.
"""

from __future__ import annotations

import html
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

DOCS_PATH = "/api/docs"
OPENAPI_PATH = "/api/openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")
#: No script, no frames, nothing fetched: the page is its own HTML and one inline style sheet.
CSP = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
_STYLE = ("body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;padding:0 1em}"
          "code,.m{font-family:ui-monospace,monospace}.op{border-top:1px solid #ddd;padding:.5em 0}"
          ".m{display:inline-block;min-width:4.5em;font-weight:bold}td{padding:0 1em 0 0;vertical-align:top}")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _params(op: dict[str, Any]) -> str:
    rows = [f"<tr><td><code>{_e(p.get('name', ''))}</code></td><td>{_e(p.get('in', ''))}</td>"
            f"<td>{'required' if p.get('required') else ''}</td><td>{_e(p.get('description', ''))}</td></tr>"
            for p in op.get("parameters", []) if isinstance(p, dict)]
    if "requestBody" in op:
        rows.append("<tr><td><code>body</code></td><td>JSON</td><td>required</td><td>see the OpenAPI document"
                    "</td></tr>")
    return f"<table>{''.join(rows)}</table>" if rows else ""


def render(doc: dict[str, Any]) -> str:
    """The page for an OpenAPI document: a heading per path, each operation with its summary and parameters."""
    info = doc.get("info", {})
    ops = []
    for path, item in sorted(doc.get("paths", {}).items()):
        for method in METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            summary = op.get("summary") or ""
            detail = (op.get("description") or "").strip()
            ops.append(f'<div class="op"><span class="m">{method.upper()}</span><code>{_e(path)}</code> '
                       f"{_e(summary)}{f'<p>{_e(detail)}</p>' if detail and detail != summary else ''}"
                       f"{_params(op)}</div>")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(info.get('title', 'API'))} reference"
            f"</title><style>{_STYLE}</style></head><body><h1>{_e(info.get('title', 'API'))} "
            f"{_e(info.get('version', ''))}</h1><p>Every call below needs a credential: <code>Authorization: "
            "Bearer &lt;token&gt;</code> (<code>llmgw login</code> saves one; the CLI sends it), or the session "
            "of the web UI at <a href=\"/ui\">/ui</a>. The machine-readable document is "
            f'<a href="{OPENAPI_PATH}"><code>{OPENAPI_PATH}</code></a>.</p>{"".join(ops)}</body></html>')


def install(app: FastAPI) -> None:
    """Serves the page at ``DOCS_PATH``; make ``app`` with ``docs_url=None`` so FastAPI's CDN page is not there too."""

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return HTMLResponse(render(request.app.openapi()),
                            headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"})
