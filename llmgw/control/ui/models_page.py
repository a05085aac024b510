"""The model page (``/ui/models/{name}``): spec as YAML, replicas and events live, scale and delete.

An autoscaled model's page shows its autoscaler (bounds, count in force, last decision, the load it
weighs) instead of the scale buttons: the API refuses a count set by hand for it anyway.

Everything comes from the REST API with the browser's credential (``Ui.call``): the page reads
``/api/v1/models/{name}/describe`` (what ``llmgw describe model`` reads), scaling PUTs the spec back
with ``replicas`` changed (what ``llmgw apply`` sends), delete is the API's DELETE. The UI decides
nothing about permissions beyond hiding controls from a viewer: a viewer who posts anyway gets the
API's 403 sentence on the page.
"""

from __future__ import annotations

import copy
import difflib
import json
import time
import urllib.parse
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.ui import common, progress
from llmgw.core import humane, specs


def _api_path(name: str) -> str:
    return f"/api/v1/models/{urllib.parse.quote(name, safe='')}"


async def _describe(ui: common.Ui, request: Request, name: str) -> common.ApiAnswer:
    answer, _ = await ui.call(request, "GET", f"{_api_path(name)}/describe")
    return answer


def _manifest_yaml(name: str, spec: dict[str, Any]) -> str:
    """The model as ``llmgw apply`` reads it: what the editor starts from and the diff compares against."""
    manifest = {"apiVersion": specs.API_VERSION, "kind": "Model", "metadata": {"name": name}, "spec": spec}
    return yaml.safe_dump(manifest, sort_keys=False)


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def autoscale_view(doc: dict[str, Any], *, now: float) -> dict[str, Any] | None:
    """An autoscaled model's panel, in words (None for a model scaled by hand): bounds, the count in force,
    the last decision's sentence and when, and the routers' merged load as the autoscaler weighs it."""
    auto = doc.get("autoscale")
    if not auto:
        return None
    changed = float(auto.get("last_change_at") or 0)
    sig = auto.get("signals")
    if sig is None:
        load = {"none": "no router has reported its load lately: the count holds"}
    else:
        ttft = sig.get("ttft_p90_ms")
        load = {"waiting": f"{sig['waiting']:g}", "in_flight": f"{sig['in_flight']:g}",
                "ttft_p90": "-" if ttft is None else f"{ttft:.0f} ms", "arrivals": f"{sig['arrived_per_s']:.1f}/s",
                "routers": str(len(auto.get("routers") or []))}
    return {"min": auto["min_replicas"], "max": auto["max_replicas"], "replicas": auto["replicas"],
            "last": auto.get("last_reason") or "no change yet", "at": changed,
            "ago": _ago(now - changed) if auto.get("last_reason") and changed else "", "load": load}


#: The spec's sizes and durations, by path: shown as a model file writes them (``512MiB``, ``5m``), which the
#: editor applies back to the same numbers.
_SIZES = (("resources", "memory"), ("resources", "gpus", "memory"))
_DURATIONS = (("startup_timeout",), *(("autoscale", k) for k in ("scale_up_after", "scale_down_after",
                                                                   "scale_to_zero_after", "cold_start_timeout")))


def readable_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (the API's numbers) with its sizes and durations in ``core.humane``'s exact words; a copy."""
    out = copy.deepcopy(spec)
    for paths, word in ((_SIZES, humane.exact_size), (_DURATIONS, humane.exact_duration)):
        for path in paths:
            parent: Any = out
            for key in path[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if isinstance(parent, dict) and path[-1] in parent:
                parent[path[-1]] = word(parent[path[-1]])
    return out


def _ctx(answer: common.ApiAnswer) -> dict[str, Any]:
    if answer.error:
        return {"error": answer.error}
    doc = answer.doc
    spec = readable_spec(doc.get("spec", {}))
    return {"doc": doc, "spec_yaml": yaml.safe_dump(spec, sort_keys=False),
            "manifest_yaml": _manifest_yaml(str(doc.get("name") or doc.get("metadata", {}).get("name", "")), spec),
            "events": list(reversed(doc.get("events", []))), "rollout": progress.rollout_of(doc),
            "fetches": {str(r.get("id")): progress.fetch_bar(r.get("fetch")) for r in doc.get("replicas", [])},
            "installs": [], "autoscale": autoscale_view(doc, now=time.time())}


async def _live(ui: common.Ui, request: Request, answer: common.ApiAnswer) -> dict[str, Any]:
    """``_ctx``, with the engine installs a replica may be waiting on (asked only while one is not Ready)."""
    ctx = _ctx(answer)
    if answer.error or all(r.get("phase") == "Ready" for r in answer.doc.get("replicas", [])):
        return ctx
    engines, _ = await ui.call(request, "GET", "/api/v1/engines")
    if not engines.error:  # the installs are extra: the page stands without them
        ctx["installs"] = progress.install_bars(answer.doc.get("spec", {}), engines.doc)
    return ctx


async def _render(ui: common.Ui, request: Request, name: str, *, error: str = "", status_code: int = 200) -> Response:
    answer = await _describe(ui, request, name)
    who = await ui.who(request)
    return ui.page(request, "model.html", status_code=answer.status if answer.error else status_code,
                   title=f"Model {name}", who=who, name=name, action_error=error,
                   can_mutate=who[1] not in ("", "viewer"), model=await _live(ui, request, answer))


async def model_page(ui: common.Ui, request: Request) -> Response:
    return await _render(ui, request, request.path_params["name"])


async def model_live(ui: common.Ui, request: Request) -> Response:
    """The refreshing part (status, replicas, events, spec), for htmx every 2 s."""
    name = request.path_params["name"]
    answer = await _describe(ui, request, name)
    return ui.page(request, "_model_live.html", name=name, model=await _live(ui, request, answer))


async def scale(ui: common.Ui, request: Request) -> Response:
    name = request.path_params["name"]
    form = await common.read_form(request)
    try:
        delta = int(form.get("delta", ""))
    except ValueError:
        delta = 0
    if delta not in (-1, 1):
        return await _render(ui, request, name, status_code=400,
                             error="scale takes delta -1 or 1 (the − and + buttons send one of them)")
    current = await _describe(ui, request, name)
    if current.error:
        return await _render(ui, request, name, error=current.error, status_code=current.status)
    # The scale call, not a PUT of the manifest: it refuses an autoscaled model with the sentence that says
    # where its count comes from (a manifest with replicas beside autoscale is refused less helpfully).
    replicas = max(0, int(current.doc["status"]["replicas"]) + delta)
    answer, _ = await ui.call(request, "POST", f"{_api_path(name)}/scale", json={"replicas": replicas})
    if answer.error:
        return await _render(ui, request, name, error=answer.error, status_code=answer.status)
    base = request.scope.get("root_path", "")
    return RedirectResponse(f"{base}/models/{urllib.parse.quote(name, safe='')}", status_code=303)


async def delete(ui: common.Ui, request: Request) -> Response:
    name = request.path_params["name"]
    answer, _ = await ui.call(request, "DELETE", _api_path(name))
    if answer.error:
        return await _render(ui, request, name, error=answer.error, status_code=answer.status)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)

# -- the list, the spec editor and replica logs ------------------------------------------------------
#: Lines a replica's log page shows (the newest), re-read every 2 s.
LOG_LINES = 200


async def models_list(ui: common.Ui, request: Request) -> Response:
    answer, _ = await ui.call(request, "GET", "/api/v1/models")
    who = await ui.who(request)
    models = {"error": answer.error} if answer.error else {"models": answer.doc.get("items", [])}
    return ui.page(request, "models.html", status_code=answer.status if answer.error else 200, title="Models",
                   who=who, models=models, can_mutate=who[1] not in ("", "viewer"))


def _parse(text: str) -> tuple[dict[str, Any] | None, str]:
    """The editor's text as one manifest, or why not, worded as ``llmgw apply`` words a YAML error."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        return None, f"the spec{where}: not valid YAML: {problem}"
    if len(docs) != 1 or not isinstance(docs[0], dict):
        # One model a form: a list or several documents would apply some and refuse others half-way.
        return None, (f"the spec holds {len(docs)} YAML documents; the editor applies exactly one model "
                      "(use `llmgw apply -f` for a file of several)" if len(docs) != 1 else
                      "the spec is not a mapping; a model file starts with apiVersion, kind, metadata and spec")
    return docs[0], ""


def _name_of(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, dict) else ""


async def _editor(ui: common.Ui, request: Request, *, text: str, error: str = "", diff: str = "",
                  diffed: bool = False, status_code: int = 200) -> Response:
    who = await ui.who(request)
    return ui.page(request, "apply.html", status_code=status_code, title="Apply a model", who=who,
                   text=text, error=error, diff=diff, diffed=diffed, can_mutate=who[1] not in ("", "viewer"))


_EXAMPLE = _manifest_yaml("my-model", {"engine": "sim", "served_name": "my-model", "replicas": 1})


async def apply_form(ui: common.Ui, request: Request) -> Response:
    return await _editor(ui, request, text=_EXAMPLE)


async def apply(ui: common.Ui, request: Request) -> Response:
    """Applies the editor's manifest (``POST /api/v1/models``, as ``llmgw apply``), or diffs it with ``op=diff``."""
    form = await common.read_form(request)
    text = form.get("spec", "")
    if not text.strip():
        return await _editor(ui, request, text=text, status_code=400,
                             error="the spec is empty (or over 16 KiB); paste a model's YAML manifest")
    doc, why = _parse(text)
    if doc is None:
        return await _editor(ui, request, text=text, error=why, status_code=400)
    if form.get("op") == "diff":
        name = _name_of(doc)
        current = ""
        if name:
            answer = await _describe(ui, request, name)
            if answer.error and answer.status != 404:
                return await _editor(ui, request, text=text, error=answer.error, status_code=answer.status)
            current = "" if answer.error else _manifest_yaml(name, readable_spec(answer.doc.get("spec", {})))
        mine = yaml.safe_dump(doc, sort_keys=False)
        diff = "".join(difflib.unified_diff(current.splitlines(keepends=True), mine.splitlines(keepends=True),
                                            fromfile=f"current/{name}" if current else "/dev/null",
                                            tofile=f"submitted/{name}"))
        return await _editor(ui, request, text=text, diff=diff or "No change: the model is already this.",
                             diffed=True)
    answer, _ = await ui.call(request, "POST", "/api/v1/models", json=doc)
    if answer.error:
        return await _editor(ui, request, text=text, error=answer.error, status_code=answer.status)
    name = _name_of(doc)
    return RedirectResponse(f"{request.scope.get('root_path', '')}/models/{urllib.parse.quote(name, safe='')}",
                            status_code=303)


async def _replica_log(ui: common.Ui, request: Request) -> dict[str, Any]:
    """The replica's shard's last lines from ``GET /api/v1/nodes/{node}/logs?shard=`` (what ``llmgw logs`` reads)."""
    name, rid = request.path_params["name"], request.path_params["rid"]
    answer = await _describe(ui, request, name)
    if answer.error:
        return {"status": answer.status, "error": answer.error}
    replica = next((r for r in answer.doc.get("replicas", []) if str(r.get("id")) == rid), None)
    if replica is None:
        return {"status": 404, "error": f"model {name} has no replica {rid}; its page lists the replicas it has"}
    if not replica.get("node") or not replica.get("shard"):
        return {"status": 200, "replica": replica,
                "error": f"replica {rid} is not placed on a node yet, so it has no log; phase {replica.get('phase')}"}
    resp = await ui.raw(request, "GET", f"/api/v1/nodes/{urllib.parse.quote(replica['node'], safe='')}/logs",
                        params={"shard": replica["shard"], "lines": str(LOG_LINES)})
    if not resp.is_success:
        return {"status": resp.status_code, "replica": replica, "error": common.api_message(resp)}
    lines: list[str] = []
    for raw in resp.text.splitlines():
        if not raw.strip():
            continue
        try:
            batch: Any = json.loads(raw)
        except ValueError:
            batch = None
        if not isinstance(batch, dict):
            return {"status": 502, "replica": replica, "error": f"the API sent a log line that is not a JSON object: "
                                                                f"{raw[:200]!r}"}
        if batch.get("error"):
            return {"status": 502, "replica": replica, "error": str(batch["error"])}
        lines.extend(str(x) for x in (batch.get("lines") or []))
    return {"status": 200, "replica": replica, "lines": lines[-LOG_LINES:]}


def _follow_url(request: Request, replica: dict[str, Any] | None) -> str:
    """The API's follow stream of the replica's log, which the page's script reads with the browser's own cookie
    (``static/logfollow.js``); "" when the replica is on no node yet. Read by the browser, not relayed here:
    the in-process client gives an answer only once it is whole, and a follow stream never is."""
    if not replica or not replica.get("node") or not replica.get("shard"):
        return ""
    root = request.scope.get("root_path", "").rpartition("/")[0]  # the server's root; the UI is one level below
    query = urllib.parse.urlencode({"shard": replica["shard"], "lines": LOG_LINES, "follow": "true"})
    return f"{root}/api/v1/nodes/{urllib.parse.quote(replica['node'], safe='')}/logs?{query}"


async def replica_log_page(ui: common.Ui, request: Request) -> Response:
    log = await _replica_log(ui, request)
    name, rid = request.path_params["name"], request.path_params["rid"]
    return ui.page(request, "replica_log.html", status_code=log["status"], title=f"Log of {name} replica {rid}",
                   who=await ui.who(request), name=name, rid=rid, log=log,
                   follow_url=_follow_url(request, log.get("replica")))


async def replica_log_tail(ui: common.Ui, request: Request) -> Response:
    """The ``<pre>``'s content, for htmx every 2 s."""
    log = await _replica_log(ui, request)
    return ui.page(request, "_replica_log.html", log=log)


def routes(ui: common.Ui) -> list[Route]:
    """The model page's routes, below the UI's mount."""

    bind = ui.bind
    return [
        Route("/models", bind(models_list), methods=["GET"]),
        Route("/apply", bind(apply_form), methods=["GET"]),
        Route("/apply", bind(apply), methods=["POST"]),
        Route("/models/{name}/replicas/{rid}/logs", bind(replica_log_page), methods=["GET"]),
        Route("/models/{name}/replicas/{rid}/logs/tail", bind(replica_log_tail), methods=["GET"]),
        Route("/models/{name}", bind(model_page), methods=["GET"]),
        Route("/models/{name}/live", bind(model_live), methods=["GET"]),
        Route("/models/{name}/scale", bind(scale), methods=["POST"]),
        Route("/models/{name}/delete", bind(delete), methods=["POST"]),
    ]
