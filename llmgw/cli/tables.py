"""The listings of ``llmgw get nodes|models|replicas|weights``: their columns, laid out by ``cli.output``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from llmgw.cli.output import Column, Listing
from llmgw.core.units import format_bytes


def agent_version(n: dict[str, Any]) -> str:
    """VERSION: the node's agent's llmgw version, ``0.1.0 (skew)`` when it is not the control plane's."""
    said = n.get("agent_version") or "-"
    return f"{said} (skew)" if n.get("version_skew") else said


def status_cell(n: dict[str, Any]) -> str:
    """The status words, then an agent upgrade under way or failed: "Ready (upgrading to 0.2.1: installing)".

    Ready / NotReady, then SchedulingDisabled (cordoned) and Draining (replicas still moving off).
    """
    status = n.get("status") or ("Ready" if n["connected"] else "NotReady")
    up = n.get("upgrade") or {}
    if up.get("summary") and up.get("state") != "done":
        status += f" ({up['summary']})"
    return str(status)


def labels_cell(labels: Mapping[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "-"


def install_state(i: dict[str, Any]) -> str:
    """"Ready", "Installing 40%" (from its bytes, when it said them), "Failed"."""
    if i["state"] == "Installing" and i.get("bytes_total"):
        return f"Installing {100 * i['bytes_done'] // i['bytes_total']}%"
    return str(i["state"])


def install_cell(installs: list[dict[str, Any]]) -> str:
    """One node's installs for ``get nodes -o wide``: "vllm 0.32.0 cpu Ready, sim 0.1 py Installing 40%"."""
    return ", ".join(" ".join(x for x in (i["engine"], i["version"], i["variant"], install_state(i)) if x)
                     for i in installs) or "-"


#: The key ``get nodes -o wide`` puts each node's entry of ``/api/v1/engines`` under (pool, installs).
ENGINES_KEY = "_engines"


def with_installs(items: list[dict[str, Any]], engines_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes for ``-o wide``: each with its pool and installs from ``/api/v1/engines``, under ENGINES_KEY."""
    by_node = {n["node"]: n for n in engines_doc.get("nodes", [])}
    return [{**n, ENGINES_KEY: by_node.get(n["id"], {})} for n in items]


def _memory(n: dict[str, Any]) -> str:
    return f"{format_bytes(n['memory_available_bytes'])} / {format_bytes(n['memory_total_bytes'])}"


def gpu_util_cell(n: dict[str, Any]) -> str:
    """GPU UTIL: each GPU's ``37%`` in index order, ``?`` for one whose agent does not report it; ``-``: no GPUs."""
    return ",".join("?" if g.get("utilization_percent") is None else f"{g['utilization_percent']}%"
                    for g in n["gpus"]) or "-"


NODES = Listing("node", (
    Column("NODE", lambda n: n["id"]),
    Column("STATUS", status_cell),
    Column("ADDRESS", lambda n: n["mgmt_addr"] or "-"),
    Column("POOL", lambda n: n.get(ENGINES_KEY, {}).get("pool") or "-", wide=True),
    Column("CPUS", lambda n: str(n["cpu_count"])),
    Column("MEMORY FREE/TOTAL", _memory),
    Column("GPUS", lambda n: str(len(n["gpus"]))),
    Column("GPU UTIL", gpu_util_cell, wide=True),
    Column("ENGINES", lambda n: ", ".join(e["name"] for e in n["engines"]) or "-"),
    Column("ENGINE VERSIONS", lambda n: ", ".join(f"{e['name']} {e['version']}" for e in n["engines"]) or "-",
           wide=True),
    Column("INSTALLS", lambda n: install_cell(n.get(ENGINES_KEY, {}).get("installs", [])), wide=True),
    Column("SHARDS", lambda n: str(n["shards"])),
    Column("VERSION", agent_version),
    # Issue 33: how routers reach its engines (direct, tunnel); `describe node` says why.
    Column("ENGINE ACCESS", lambda n: (n.get("engine_access") or {}).get("mode") or "-", wide=True),
    Column("LABELS", lambda n: labels_cell(n.get("labels")), wide=True),
), name=lambda n: str(n["id"]), labels=lambda n: n.get("labels") or {})


def ready_cell(m: dict[str, Any]) -> str:
    """READY: ``1/2``; an autoscaled model's adds its bounds, ``1/2 (auto 0–3)``: 2 is the autoscaler's count now."""
    st, auto = m["status"], m["spec"].get("autoscale")
    cell = f"{st['ready_replicas']}/{st['replicas']}"
    return f"{cell} (auto {auto['min_replicas']}–{auto['max_replicas']})" if auto else cell


def model_labels(m: dict[str, Any]) -> Mapping[str, str]:
    return m.get("metadata", {}).get("labels") or {}


MODELS = Listing("model", (
    Column("MODEL", lambda m: m["metadata"]["name"]),
    Column("ENGINE", lambda m: m["spec"]["engine"]),
    Column("SERVED AS", lambda m: m["spec"]["served_name"]),
    Column("READY", ready_cell),
    Column("STATE", lambda m: m["status"]["state"]),
    Column("SOURCE", lambda m: m["spec"].get("source") or "-", wide=True),
    Column("GENERATION", lambda m: str(m["status"].get("generation", "-")), wide=True),
    Column("LABELS", lambda m: labels_cell(model_labels(m)), wide=True),
    Column("MESSAGE", lambda m: m["status"]["message"]),
), name=lambda m: str(m["metadata"]["name"]), labels=model_labels)


def _rate(bps: float) -> str:
    return f"{bps / 1e9:.1f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.0f} MB/s"


def phase_of(r: dict[str, Any]) -> str:
    """A replica's phase as `get replicas` shows it: ``Fetching 41% 210 MB/s`` while its weights (or adapters) download.

    A download of unknown size says how much has come; a stalled one says so
    in place of a rate that would read 0 (the message says why).
    """
    if r.get("sleep_level"):
        return f"Sleeping (level {r['sleep_level']})"  # spec.idle: Ready, its engine asleep
    f = r.get("fetch")
    if not f:
        return str(r["phase"])
    far = f"{int(100 * f['done_bytes'] / f['total_bytes'])}%" if f["total_bytes"] else format_bytes(f["done_bytes"])
    # A Ready replica fetches a LoRA adapter its engine loads while it serves.
    lead = "Ready, fetching an adapter" if r["phase"] == "Ready" else "Fetching"
    if f["state"] == "stalled":
        return f"{lead} {far} stalled"
    if f["state"] == "verifying":
        return f"{lead} {far} verifying"
    return f"{lead} {far} {_rate(f['rate_bps'])}"


def fetch_bar(f: dict[str, Any], *, width: int = 30) -> str:
    """A text progress bar with the bytes, rate and time left: ``[#######.......] 41% 4.1 GiB of 10.0 GiB ...``."""
    total, done = f["total_bytes"], f["done_bytes"]
    if total:
        filled = min(width, int(width * done / total))
        head = f"[{'#' * filled}{'.' * (width - filled)}] {int(100 * done / total)}% " \
               f"{format_bytes(done)} of {format_bytes(total)}"
    else:
        head = f"[{'?' * width}] {format_bytes(done)} of an unknown size"
    if f["state"] == "stalled":
        return f"{head}, stalled: {f['message'] or 'no bytes are arriving'}"
    eta = f", {int(f['eta_s'])}s left" if f["eta_s"] >= 0 else ""
    return f"{head}, {_rate(f['rate_bps'])}{eta}" + (" (verifying)" if f["state"] == "verifying" else "")


# SHARD is what `llmgw logs NODE SHARD` takes.
ADAPTERS = Listing("adapter", (
    Column("ADAPTER", lambda a: a["name"]),
    Column("BASE", lambda a: a["base"]),
    Column("SOURCE", lambda a: a["source"]),
    Column("RANK", lambda a: str(a["rank"] or "-")),
    Column("APPLIED AS", lambda a: a["applied"]),
), name=lambda a: a["name"])

REPLICAS = Listing("replica", (
    Column("REPLICA", lambda r: r["id"]),
    Column("MODEL", lambda r: r["model"]),
    Column("PHASE", phase_of),
    Column("NODE", lambda r: r["node"] or "-"),
    Column("SHARD", lambda r: r["shard"] or "-"),
    Column("ENDPOINT", lambda r: r["endpoint"] or "-"),
    Column("ATTEMPT", lambda r: str(r.get("attempt", "-")), wide=True),
    Column("FAILURES", lambda r: str(r.get("failures", "-")), wide=True),
    Column("MESSAGE", lambda r: r["message"]),
), name=lambda r: str(r["id"]))


def _ago(unix: int, now: float) -> str:
    if not unix:
        return "never"
    s = max(int(now - unix), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def weights(*, now: float | None = None) -> Listing:
    # NAME is the cache name RemoveWeights takes for what llmgw fetched, the path for the rest.
    # FETCHED "no": found on disk, which llmgw never removes. MODELS "-": nothing asks for it.
    def last_used(w: dict[str, Any]) -> str:
        return _ago(w["last_used_unix"], time.time() if now is None else now) if w["fetched_by_llmgw"] else "-"

    return Listing("weight", (
        Column("NODE", lambda w: w["node"]),
        Column("NAME", lambda w: w["cache_name"] or w["path"]),
        Column("SIZE", lambda w: format_bytes(w["size_bytes"])),
        Column("SOURCE", lambda w: w["source"] or "-"),
        Column("LAST USED", last_used),
        Column("FETCHED", lambda w: "yes" if w["fetched_by_llmgw"] else "no"),
        Column("PATH", lambda w: w["path"] or "-", wide=True),
        Column("MODELS", lambda w: ", ".join(w["models"]) or "-"),
    ), name=lambda w: f"{w['node']}:{w['cache_name'] or w['path']}")
