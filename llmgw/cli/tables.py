"""Rich tables for ``llmgw get``."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from llmgw.core.units import format_bytes


def nodes(items: list[dict[str, Any]]) -> Table:
    t = Table("NODE", "STATUS", "ADDRESS", "CPUS", "MEMORY FREE/TOTAL", "GPUS", "ENGINES", "SHARDS")
    for n in items:
        # Ready / NotReady, then SchedulingDisabled (cordoned) and Draining (replicas still moving off).
        status = n.get("status") or ("Ready" if n["connected"] else "NotReady")
        t.add_row(n["id"], status, n["mgmt_addr"], str(n["cpu_count"]),
                  f"{format_bytes(n['memory_available_bytes'])} / {format_bytes(n['memory_total_bytes'])}",
                  str(len(n["gpus"])), ", ".join(e["name"] for e in n["engines"]) or "-", str(n["shards"]))
    return t


def models(items: list[dict[str, Any]]) -> Table:
    t = Table("MODEL", "ENGINE", "SERVED AS", "READY", "STATE", "MESSAGE")
    for m in items:
        st = m["status"]
        t.add_row(m["metadata"]["name"], m["spec"]["engine"], m["spec"]["served_name"],
                  f"{st['ready_replicas']}/{st['replicas']}", st["state"], st["message"])
    return t


def replicas(items: list[dict[str, Any]]) -> Table:
    # SHARD is what `llmgw logs NODE SHARD` takes.
    t = Table("REPLICA", "MODEL", "PHASE", "NODE", "SHARD", "ENDPOINT", "MESSAGE")
    for r in items:
        t.add_row(r["id"], r["model"], r["phase"], r["node"] or "-", r["shard"] or "-", r["endpoint"] or "-",
                  r["message"])
    return t
