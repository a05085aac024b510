"""What the model page draws as progress, decided from the API's documents (pure: no I/O).

Numbers only, never parsed from a sentence: a replica's weights fetch is its ``fetch`` document
(``done_bytes``/``total_bytes``, as its node last reported), an engine install is its node's install
document (``bytes_done``/``bytes_total``), and the rollout is counted from the replicas' ``current``
flag (their spec's fingerprint is the model's) and phase.
"""

from __future__ import annotations

from typing import Any

#: Replica phases that no longer count towards the model: they are on their way out.
_LEAVING = ("Terminating",)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def bar(done: int, total: int, *, step: str, rate_bps: float = 0.0, eta_s: float = -1.0,
        message: str = "") -> dict[str, Any]:
    """A ``<progress>``'s value and max (max 0: the size is not known yet, drawn without a value) and its words."""
    done, total = max(0, done), max(0, total)
    pct = min(100, round(100 * done / total)) if total else None
    words = [f"{step} {pct}%" if pct is not None else step,
             f"{_size(done)} of {_size(total)}" if total else f"{_size(done)} so far"]
    if rate_bps > 0:
        words.append(f"{_size(rate_bps)}/s")
    if eta_s >= 0 and pct != 100:
        words.append(f"{eta_s:.0f} s left")
    if message:
        words.append(message)
    return {"value": done, "max": total, "pct": pct, "label": " · ".join(words)}


def fetch_bar(fetch: dict[str, Any] | None) -> dict[str, Any] | None:
    """A replica's weights fetch (its ``fetch`` document) as a bar; None when it is not fetching."""
    if not fetch:
        return None
    return bar(int(fetch.get("done_bytes") or 0), int(fetch.get("total_bytes") or 0),
               step=str(fetch.get("state") or "fetching"), rate_bps=float(fetch.get("rate_bps") or 0.0),
               eta_s=float(fetch.get("eta_s", -1.0)), message=str(fetch.get("message") or ""))


def _version_matches(installed: str, wanted: str) -> bool:
    # As the spec reads engine_version: exact, or a prefix ending at a dot ("0.11" takes "0.11.2").
    return not wanted or installed == wanted or installed.startswith(wanted.rstrip(".") + ".")


def install_bars(spec: dict[str, Any], engines_doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The installs of the model's engine (and engine_version) still Installing, on any node, each as a bar."""
    engine, version = str(spec.get("engine", "")), str(spec.get("engine_version") or "")
    out = []
    for node in engines_doc.get("nodes", []):
        for i in node.get("installs", []):
            if i.get("state") != "Installing" or i.get("engine") != engine:
                continue
            if not _version_matches(str(i.get("version", "")), version):
                continue
            out.append({"node": node.get("node", ""), "engine": engine, "version": i.get("version", ""),
                        **bar(int(i.get("bytes_done") or 0), int(i.get("bytes_total") or 0),
                              step=str(i.get("message") or "installing"))})
    return out


def rollout_of(doc: dict[str, Any]) -> dict[str, Any]:
    """How far the model's replicas run its current spec: "up to date", or "rolling: 1 of 3 updated".

    Updated means Ready on the current spec; a replica still starting on it is not yet. A model with no
    replica on an old spec is up to date even while it scales (Ready x/y says that).
    """
    desired = int((doc.get("status") or {}).get("replicas") or 0)
    live = [r for r in doc.get("replicas", []) if r.get("phase") not in _LEAVING]
    updated = sum(1 for r in live if r.get("current") and r.get("phase") == "Ready")
    old = sum(1 for r in live if not r.get("current"))
    if not old:
        return {"rolling": False, "updated": updated, "desired": desired, "old": 0, "text": "up to date"}
    return {"rolling": True, "updated": updated, "desired": desired, "old": old,
            "text": f"rolling: {updated} of {desired} updated, {old} on the old spec"}
