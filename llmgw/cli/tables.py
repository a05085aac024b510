"""Rich tables for ``llmgw get``."""

from __future__ import annotations

import time
from typing import Any

from rich.table import Table

from llmgw.core.units import format_bytes


def agent_version(n: dict[str, Any]) -> str:
    """VERSION: the node's agent's llmgw version, ``0.1.0 (skew)`` when it is not the control plane's."""
    said = n.get("agent_version") or "-"
    return f"{said} (skew)" if n.get("version_skew") else said


def nodes(items: list[dict[str, Any]]) -> Table:
    t = Table("NODE", "STATUS", "ADDRESS", "CPUS", "MEMORY FREE/TOTAL", "GPUS", "ENGINES", "SHARDS", "VERSION")
    for n in items:
        # Ready / NotReady, then SchedulingDisabled (cordoned) and Draining (replicas still moving off).
        status = n.get("status") or ("Ready" if n["connected"] else "NotReady")
        t.add_row(n["id"], status, n["mgmt_addr"], str(n["cpu_count"]),
                  f"{format_bytes(n['memory_available_bytes'])} / {format_bytes(n['memory_total_bytes'])}",
                  str(len(n["gpus"])), ", ".join(e["name"] for e in n["engines"]) or "-", str(n["shards"]),
                  agent_version(n))
    return t


def install_state(i: dict[str, Any]) -> str:
    """"Ready", "Installing 40%" (from its bytes, when it said them), "Failed"."""
    if i["state"] == "Installing" and i.get("bytes_total"):
        return f"Installing {100 * i['bytes_done'] // i['bytes_total']}%"
    return str(i["state"])


def install_cell(installs: list[dict[str, Any]]) -> str:
    """One node's installs for ``get nodes -o wide``: "vllm 0.32.0 cpu Ready, sim 0.1 py Installing 40%"."""
    return ", ".join(" ".join(x for x in (i["engine"], i["version"], i["variant"], install_state(i)) if x)
                     for i in installs) or "-"


def nodes_wide(items: list[dict[str, Any]], engines_doc: dict[str, Any]) -> Table:
    """``get nodes -o wide``: the table, with each node's pool and engine installs (``/api/v1/engines``)."""
    by_node = {n["node"]: n for n in engines_doc.get("nodes", [])}
    t = Table("NODE", "STATUS", "ADDRESS", "POOL", "CPUS", "MEMORY FREE/TOTAL", "GPUS", "ENGINES", "INSTALLS",
              "SHARDS", "VERSION")
    for n in items:
        status = n.get("status") or ("Ready" if n["connected"] else "NotReady")
        mine = by_node.get(n["id"], {})
        t.add_row(n["id"], status, n["mgmt_addr"], mine.get("pool") or "-", str(n["cpu_count"]),
                  f"{format_bytes(n['memory_available_bytes'])} / {format_bytes(n['memory_total_bytes'])}",
                  str(len(n["gpus"])), ", ".join(f"{e['name']} {e['version']}" for e in n["engines"]) or "-",
                  install_cell(mine.get("installs", [])), str(n["shards"]), agent_version(n))
    return t


def ready_cell(m: dict[str, Any]) -> str:
    """READY: ``1/2``; an autoscaled model's adds its bounds, ``1/2 (auto 0–3)``: 2 is the autoscaler's count now."""
    st, auto = m["status"], m["spec"].get("autoscale")
    cell = f"{st['ready_replicas']}/{st['replicas']}"
    return f"{cell} (auto {auto['min_replicas']}–{auto['max_replicas']})" if auto else cell


def models(items: list[dict[str, Any]]) -> Table:
    t = Table("MODEL", "ENGINE", "SERVED AS", "READY", "STATE", "MESSAGE")
    for m in items:
        st = m["status"]
        t.add_row(m["metadata"]["name"], m["spec"]["engine"], m["spec"]["served_name"], ready_cell(m), st["state"],
                  st["message"])
    return t


def _rate(bps: float) -> str:
    return f"{bps / 1e9:.1f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.0f} MB/s"


def phase_of(r: dict[str, Any]) -> str:
    """A replica's phase as `get replicas` shows it: ``Fetching 41% 210 MB/s`` while its weights download.

    A download of unknown size says how much has come; a stalled one says so
    in place of a rate that would read 0 (the message says why).
    """
    f = r.get("fetch")
    if not f:
        return str(r["phase"])
    far = f"{int(100 * f['done_bytes'] / f['total_bytes'])}%" if f["total_bytes"] else format_bytes(f["done_bytes"])
    if f["state"] == "stalled":
        return f"Fetching {far} stalled"
    if f["state"] == "verifying":
        return f"Fetching {far} verifying"
    return f"Fetching {far} {_rate(f['rate_bps'])}"


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


def replicas(items: list[dict[str, Any]]) -> Table:
    # SHARD is what `llmgw logs NODE SHARD` takes.
    t = Table("REPLICA", "MODEL", "PHASE", "NODE", "SHARD", "ENDPOINT", "MESSAGE")
    for r in items:
        t.add_row(r["id"], r["model"], phase_of(r), r["node"] or "-", r["shard"] or "-", r["endpoint"] or "-",
                  r["message"])
    return t


def _ago(unix: int, now: float) -> str:
    if not unix:
        return "never"
    s = max(int(now - unix), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size:
            return f"{s // size}{unit} ago"
    return f"{s}s ago"


def weights(items: list[dict[str, Any]], *, now: float | None = None) -> Table:
    # NAME is the cache name RemoveWeights takes for what llmgw fetched, the path for the rest.
    # FETCHED "no": found on disk, which llmgw never removes. MODELS "-": nothing asks for it.
    now = time.time() if now is None else now
    t = Table("NODE", "NAME", "SIZE", "SOURCE", "LAST USED", "FETCHED", "MODELS")
    for w in items:
        t.add_row(w["node"], w["cache_name"] or w["path"], format_bytes(w["size_bytes"]), w["source"] or "-",
                  _ago(w["last_used_unix"], now) if w["fetched_by_llmgw"] else "-",
                  "yes" if w["fetched_by_llmgw"] else "no", ", ".join(w["models"]) or "-")
    return t
