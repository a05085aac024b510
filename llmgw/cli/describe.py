"""``llmgw describe model|node NAME``, ``llmgw events`` and ``llmgw cordon|uncordon|drain NODE``.

Events print one a line, plainly (no table), so ``llmgw events -f | grep
Warning`` sees each as it comes; ``-f`` asks for those after the last id it
printed, once a second, which survives a control plane restart (ids come from
the database).
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import output, tables
from llmgw.cli.output import Table
from llmgw.core import humane
from llmgw.core.errors import LlmgwError

console = Console(soft_wrap=True, highlight=False)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)
FOLLOW_INTERVAL_S = 1.0


def _client(url: str | None) -> client_mod.Client:
    return client_mod.Client(url or client_mod.default_url())


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", markup=True)
    return typer.Exit(1)


def ago(ts: float, now: float) -> str:
    """12s, 5m, 3h, 2d: how long ago ``ts`` was."""
    if not ts:
        return "-"
    s = max(0, int(now - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def event_line(e: dict[str, Any]) -> str:
    when = datetime.datetime.fromtimestamp(e["time"], datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{when}  {e['kind']:<7}  {e['reason']:<18}  {e['object']:<28}  {e['message']}"


def conditions_table(conds: list[dict[str, Any]], now: float) -> Table:
    t = Table(("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"))
    for c in conds:
        t.add_row(c["type"], c["status"], c["reason"], ago(c["last_transition"], now), c["message"])
    return t


def _events_table(items: list[dict[str, Any]], now: float) -> Table:
    t = Table(("AGE", "KIND", "REASON", "OBJECT", "MESSAGE"))
    for e in items:
        t.add_row(ago(e["time"], now), e["kind"], e["reason"], e["object"], e["message"])
    return t


def _short(conds: list[dict[str, Any]]) -> str:
    return " ".join(f"{c['type']}={c['status']}" + (f"({c['reason']})" if c["status"] != "True"
                                                    or c["type"] == "Degraded" else "") for c in conds)


_TARGETS = (("queue_per_replica", "queue {:g} per replica"), ("inflight_per_replica", "in flight {:g} per replica"),
            ("ttft_p90_ms", "TTFT p90 {:g} ms"), ("tokens_per_s_per_replica", "{:g} tokens/s per replica"))


def autoscale_targets(auto: dict[str, Any]) -> str:
    """The spec's targets and windows in a line: what the Load line is weighed against, and how fast it moves."""
    targets = ", ".join(words.format(auto[k]) for k, words in _TARGETS if auto.get(k))
    d = humane.duration
    windows = (f"up after {d(auto.get('scale_up_after', 0))}, down after {d(auto.get('scale_down_after', 0))}"
               + (f", to zero after {d(auto.get('scale_to_zero_after', 0))} idle" if auto.get("min_replicas") == 0
                  else "")
               + f"; cold start up to {d(auto.get('cold_start_timeout', 0))}")
    return f"{targets or '-'}; {windows}"


def print_model(doc: dict[str, Any], now: float) -> None:
    spec, st = doc["spec"], doc["status"]
    rollout = spec.get("rollout") or {}
    lines = [
        ("Name", doc["name"]),
        ("Engine", f"{spec['engine']}  source: {spec.get('source') or '-'}"),
        ("Served as", spec["served_name"] + (f" (aliases: {', '.join(spec['aliases'])})" if spec.get("aliases")
                                            else "")),
        ("Replicas", f"{st['replicas']} desired, {st['ready_replicas']} Ready, {st['updated_replicas']} on the "
                     f"current spec {doc['fingerprint']}"),
        ("Rollout", f"max_surge {rollout.get('max_surge', 1)}, max_unavailable {rollout.get('max_unavailable', 0)}"),
        ("Generation", f"{doc['generation']} (updated {ago(doc['updated_at'], now)} ago)"),
        ("State", f"{st['state']}: {st['message']}"),
    ]
    auto = doc.get("autoscale")
    if auto:
        sig = auto.get("signals")
        if sig is None:
            load = "no router reports (the count holds)"
        else:
            ttft = "-" if sig["ttft_p90_ms"] is None else f"{sig['ttft_p90_ms']:.0f} ms"
            load = (f"{sig['arrived_per_s']:.1f} req/s, {sig['waiting']:g} waiting, {sig['in_flight']:g} in flight, "
                    f"TTFT p90 {ttft}, {sig['tokens_per_s']:.0f} tokens/s from {len(auto['routers'])} router(s)")
        last = (f"{auto['last_reason']} ({ago(auto['last_change_at'], now)} ago)" if auto["last_reason"]
                else "no change yet")
        lines[3:3] = [("Autoscale", f"{auto['replicas']} in force (min {auto['min_replicas']}, max "
                                    f"{auto['max_replicas']}); last: {last}"),
                      ("Targets", autoscale_targets(spec.get("autoscale") or {})), ("Load", load)]
    for k, v in lines:
        console.print(f"{k + ':':<12} {v}", markup=False)
    console.print("\nConditions:", markup=False)
    output.emit(conditions_table(doc["conditions"], now).text())
    console.print("\nReplicas:", markup=False)
    t = Table(("REPLICA", "PHASE", "NODE", "GPUS", "ENDPOINT", "SPEC", "CONDITIONS", "MESSAGE"))
    for r in doc["replicas"]:
        t.add_row(r["id"], tables.phase_of(r), r["node"] or "-", ",".join(str(g) for g in r["gpus"]) or "-",
                  r["endpoint"] or "-", "current" if r["current"] else "old", _short(r["conditions"]), r["message"])
    output.emit(t.text())
    for r in doc["replicas"]:
        if r.get("fetch"):
            console.print(f"  {r['id']} fetching its weights: {tables.fetch_bar(r['fetch'])}", markup=False)
    adapters = [a.get("name", "") for a in doc.get("spec", {}).get("adapters", [])]
    for r in doc["replicas"] if adapters else ():
        held = r.get("adapters", [])
        missing = [a for a in adapters if a not in held]
        console.print(f"  {r['id']} holds adapters: {', '.join(held) or 'none'}"
                      + (f" (not yet: {', '.join(missing)})" if missing else ""), markup=False)
    for r in doc["replicas"]:
        # A crash loop's or a hung engine's whole sentence, with the engine's last output.
        loop = [c for c in r["conditions"] if c["type"] == "Degraded" and c["reason"] in ("CrashLoop", "Unhealthy")]
        if loop:
            console.print(f"  {r['id']}: {loop[0]['message']}", markup=False)
    console.print("\nEvents:", markup=False)
    output.emit(_events_table(doc["events"], now).text() if doc["events"] else "  none\n")


def print_installs(installs: list[dict[str, Any]], now: float) -> None:
    """The node's Engines section: each install's state and variant, its message, and what it lacks to run."""
    console.print("\nEngines (installed by llmgw):", markup=False)
    if not installs:
        console.print("  none", markup=False)
        return
    t = Table(("ENGINE", "VERSION", "VARIANT", "STATE", "MESSAGE"))
    for i in installs:
        retry = f" (tried again in {max(0, round(i['retry_unix'] - now))}s)" \
            if i["state"] == "Failed" and i.get("retry_unix") else ""
        t.add_row(i["engine"], i["version"], i["variant"] or "-", tables.install_state(i),
                  (i["message"] or "-") + retry)
    output.emit(t.text())
    for i in installs:
        if i["missing_os_packages"]:
            run = f"; run as root: {i['os_install_command']}" if i["os_install_command"] else ""
            console.print(f"  {i['engine']} {i['version']} lacks OS packages {', '.join(i['missing_os_packages'])}"
                          f"{run}", markup=False)
        if i["state"] == "Failed" and i["last_output"]:
            console.print(f"  {i['engine']} {i['version']} failed; its last output:", markup=False)
            for line in i["last_output"][-10:]:
                console.print(f"    {line}", markup=False)


def _gpu(g: dict[str, Any]) -> str:
    """A GPU's name, and how busy it is where its agent says (``NVIDIA H100 80GB HBM3 (37% busy)``)."""
    busy = g.get("utilization_percent")
    return g["name"] if busy is None else f"{g['name']} ({busy}% busy)"


def print_node(doc: dict[str, Any], now: float) -> None:
    for k, v in (("Name", doc["id"]), ("Status", doc["status"]), ("Address", doc["mgmt_addr"] or "-"),
                 ("Agent", tables.agent_version(doc)), ("Last seen", f"{ago(doc['last_seen'], now)} ago"),
                 ("CPUs", str(doc["cpu_count"])), ("GPUs", ", ".join(_gpu(g) for g in doc["gpus"]) or "none"),
                 ("Engines", ", ".join(f"{e['name']} {e['version']}" for e in doc["engines"]) or "none")):
        console.print(f"{k + ':':<12} {v}", markup=False)
    if up := doc.get("upgrade"):
        console.print(f"{'Upgrade:':<12} {up['summary']}" + (f": {up['message']}" if up.get("message") else ""),
                      markup=False)
    if access := doc.get("engine_access"):  # issue 33: direct or through its tunnel, and why
        console.print(f"{'Engines at:':<12} {access['mode']}: {access['reason']}", markup=False)
    print_installs(doc.get("installs", []), now)
    console.print("\nReplicas:", markup=False)
    t = Table(("REPLICA", "MODEL", "PHASE", "SHARD", "GPUS", "MESSAGE"))
    for r in doc["replicas"]:
        t.add_row(r["id"], r["model"], tables.phase_of(r), r["shard"] or "-",
                  ",".join(str(g) for g in r["gpus"]) or "-", r["message"])
    output.emit(t.text() if doc["replicas"] else "  none\n")
    console.print("\nEvents:", markup=False)
    output.emit(_events_table(doc["events"], now).text() if doc["events"] else "  none\n")


def register(app: typer.Typer) -> None:
    """Adds ``describe``, ``events``, ``cordon``, ``uncordon`` and ``drain`` to ``app``."""
    describe_app = typer.Typer(no_args_is_help=True, help="Show a model or node in detail: conditions, events.")
    app.add_typer(describe_app, name="describe")
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")

    def _show(kind: str, name: str, url: str | None, show: Callable[[dict[str, Any], float], None]) -> None:
        try:
            doc = _client(url).get(f"/api/v1/{kind}/{quote(name, safe='')}/describe")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        show(doc, time.time())

    @describe_app.command("model")
    def describe_model(name: str, url: str = url_opt) -> None:
        """A model's spec, replicas, conditions and recent events."""
        _show("models", name, url, print_model)

    @describe_app.command("node")
    def describe_node(name: str, url: str = url_opt) -> None:
        """A node's status, the replicas on it and its recent events."""
        _show("nodes", name, url, print_node)

    @app.command("events")
    def events(model: str = typer.Option(None, "--model", help="Only this model's (and its replicas')"),
               node: str = typer.Option(None, "--node", help="Only this node's (and the replicas on it)"),
               lines: int = typer.Option(100, "-n", "--lines", min=1, max=10_000, help="How many of the newest"),
               follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new ones"),
               url: str = url_opt) -> None:
        """What happened: placements, failures, rolls, nodes coming and going (oldest first)."""
        if model and node:
            raise _fail("give --model or --node, not both")
        params: dict[str, str] = {"limit": str(lines)}
        if model:
            params["model"] = model
        if node:
            params["node"] = node
        c = _client(url)
        after = 0
        try:
            while True:
                items = c.get(f"/api/v1/events?{urlencode({**params, 'after': str(after)})}")["items"]
                for e in items:
                    print(event_line(e), flush=True)
                    after = max(after, int(e["id"]))
                if not follow:
                    if not after:
                        # Said on stderr, so a script reading the lines sees none; a person sees why.
                        which = f" for model {model!r}" if model else f" for node {node!r}" if node else ""
                        print(f"no events{which}; `llmgw get models` and `llmgw get nodes` list what exists",
                              file=sys.stderr)
                    return
                time.sleep(FOLLOW_INTERVAL_S)
        except KeyboardInterrupt:
            return
        except BrokenPipeError:
            return
        except LlmgwError as e:
            raise _fail(str(e)) from None

    def _mark(action: str, node: str, url: str | None, done: str) -> None:
        try:
            _, doc = _client(url).request("POST", f"/api/v1/nodes/{quote(node, safe='')}/{action}")
        except LlmgwError as e:
            raise _fail(str(e)) from None
        console.print(f"node/{node} {done} ({doc['status']})", markup=False)

    @app.command("cordon")
    def cordon(node: str, url: str = url_opt) -> None:
        """Place no new replica on NODE; what runs there stays (kept across restarts)."""
        _mark("cordon", node, url, "cordoned")

    @app.command("uncordon")
    def uncordon(node: str, url: str = url_opt) -> None:
        """Let replicas be placed on NODE again (ends a drain)."""
        _mark("uncordon", node, url, "uncordoned")

    @app.command("drain")
    def drain(node: str, url: str = url_opt) -> None:
        """Cordon NODE and move its replicas elsewhere, each once its replacement is Ready."""
        _mark("drain", node, url, "draining")
