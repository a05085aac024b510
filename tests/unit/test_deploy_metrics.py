"""``deploy/grafana`` and ``deploy/prometheus`` against the code: every metric a dashboard or a rule reads is one the
control plane's or a router's ``/metrics`` exposes, every dashboard takes its datasource from ``${DS_PROMETHEUS}``,
and every alert has a promtool unit test that shows it firing and one that shows it quiet.

The names are read from the exposition of the control plane's real ``/metrics`` app (every registry the server
serves: its own, the in-process router's with the engines' re-exported series, the agent service's, usage and
budgets, backups), so renaming a metric in the code fails here.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import yaml

from llmgw.control.agentsvc import metrics as agentsvc_metrics
from llmgw.control.auth import Auth
from llmgw.control.backup import schedule as backup_schedule
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.control.usage.service import UsageService
from llmgw.router import enginemetrics
from llmgw.router import metrics as router_metrics
from llmgw.testing import dashboards

#: Prometheus's own series a rule may read besides llmgw's.
PROMETHEUS_OWN = {"up"}


def exposed(tmp_path: Path) -> set[str]:
    """Every sample name the server's ``GET /metrics`` can carry, read from its exposition."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    usage = UsageService(db)
    app = create_api(db, Cluster(store), auth=Auth.insecure(), usage=usage,
                     extra_registries=(router_metrics.REGISTRY, agentsvc_metrics.REGISTRY, usage.registry,
                                       backup_schedule.REGISTRY),
                     cert_files={"ca": tmp_path / "missing.crt"})

    async def scrape() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://cp") as client:
            response = await client.get("/metrics")
            assert response.status_code == 200, response.text
            return response.text
    try:
        return dashboards.exposition_names(asyncio.run(scrape()))
    finally:
        db.close()
        store.close()


def test_every_metric_the_dashboards_and_rules_read_is_exported(tmp_path: Path) -> None:
    names = exposed(tmp_path)
    assert set(enginemetrics.names()) <= names  # the engines' series, re-exported by the router
    used: dict[str, set[str]] = {}
    for q in [*dashboards.panel_queries(), *dashboards.variable_queries()]:
        for name in dashboards.metric_names(q.expr):
            used.setdefault(name, set()).add(f"{q.dashboard}: {q.panel}")
    for rule in dashboards.rules():
        for name in dashboards.metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"rule {rule['alert']}")
    assert len(used) >= 20, sorted(used)  # the extraction found the dashboards' metrics
    unknown = {name: sorted(where) for name, where in used.items() if name not in names}
    assert not unknown, f"metrics no llmgw process exports (renamed?): {unknown}"


def test_metric_names_are_found_in_queries_but_not_in_label_values() -> None:
    assert dashboards.metric_names('sum by (le) (rate(llmgw_a_bucket{job=~"llmgw_b.*"}[5m])) / llmgw_c') \
        == {"llmgw_a_bucket", "llmgw_c"}
    assert dashboards.metric_names("label_values(llmgw_model_replicas, model)") == {"llmgw_model_replicas"}
    text = ("# TYPE llmgw_x counter\n# TYPE llmgw_y_total counter\n# TYPE llmgw_h histogram\n"
            "# TYPE llmgw_g gauge\n")
    assert dashboards.exposition_names(text) == {"llmgw_x_total", "llmgw_y_total", "llmgw_h_bucket", "llmgw_h_sum",
                                                 "llmgw_h_count", "llmgw_g"}


#: PromQL's words the queries use (functions, aggregations, operators); any other bare name is a metric.
PROMQL = {"sum", "max", "min", "count", "avg", "rate", "increase", "changes", "histogram_quantile", "time", "and",
          "or", "unless", "by", "without", "on", "ignoring", "label_values", "vector"}


def other_metrics(expr: str) -> set[str]:
    """Names in ``expr`` that are neither llmgw's nor PromQL's own words: labels' matchers, ``by (...)`` lists,
    ranges and Grafana's variables taken out first."""
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring)\s*\([^)]*\)|\$\w+", " ", expr)
    bare = re.sub(r"^label_values\(\s*(\w+)\s*,\s*\w+\s*\)$", r"\1", bare.strip())  # its second name is a label
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare))
    return {w for w in words if not w.startswith("llmgw_") and w not in PROMQL}


def test_queries_read_no_metric_but_llmgw_and_prometheus_own() -> None:
    assert other_metrics('sum by (model, le) (rate(node_cpu_seconds_total{job="x"}[5m])) and up') \
        == {"node_cpu_seconds_total", "up"}
    for rule in dashboards.rules():
        assert other_metrics(rule["expr"]) <= PROMETHEUS_OWN, rule["alert"]
    for q in [*dashboards.panel_queries(), *dashboards.variable_queries()]:
        assert other_metrics(q.expr) == set(), (q.dashboard, q.panel, q.expr)


def test_every_dashboard_takes_its_datasource_from_DS_PROMETHEUS() -> None:
    docs = dashboards.dashboards()
    assert {"llmgw-cluster.json", "llmgw-router.json", "llmgw-model.json", "llmgw-usage.json"} <= set(docs)
    uids = [doc["uid"] for doc in docs.values()]
    assert len(set(uids)) == len(uids)
    for name, doc in docs.items():
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert variables["DS_PROMETHEUS"]["type"] == "datasource", name
        assert variables["DS_PROMETHEUS"]["query"] == "prometheus", name
        ids = [p["id"] for p in dashboards.panels(doc)]
        assert len(set(ids)) == len(ids), f"{name}: panel ids repeat"
        for p in dashboards.panels(doc):
            assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, (name, p["title"])
            assert p["targets"], (name, p["title"])
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${DS_PROMETHEUS}", (name, p["title"])
        for v in variables.values():
            if v["type"] == "query":
                assert v["datasource"]["uid"] == "${DS_PROMETHEUS}", (name, v["name"])
    model = {v["name"] for v in docs["llmgw-model.json"]["templating"]["list"]}
    assert "model" in model
    assert all("$model" in q.expr for q in dashboards.panel_queries() if q.dashboard == "llmgw-model.json")


def test_every_alert_has_a_unit_test_firing_and_one_quiet() -> None:
    alerts = {r["alert"] for r in dashboards.rules()}
    assert {"LlmgwNodeDown", "LlmgwReplicaCrashLooping", "LlmgwTtftP99High", "LlmgwModelNoReadyReplica",
            "LlmgwLeaderChangingOften", "LlmgwCertificateExpiresSoon", "LlmgwBudgetNearlySpent"} <= alerts
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in sorted(dashboards.RULE_TESTS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", ()):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert alerts <= firing, f"alerts without a test that fires them: {sorted(alerts - firing)}"
    assert alerts <= quiet, f"alerts without a test that they stay quiet: {sorted(alerts - quiet)}"
