"""The queries of ``deploy/grafana``'s dashboards and ``deploy/prometheus``'s rules, for the tests that check them.

``panel_queries`` yields every panel's PromQL with Grafana's variables substituted (``substitute``), so a test can
run each against a real Prometheus; ``metric_names`` finds the llmgw metric names a query uses, so a test can check
each against what the code exports (a renamed metric breaks a test, not a dashboard in production).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
PROMETHEUS = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules"
RULE_TESTS = PROMETHEUS / "tests"
SCRAPE_CONFIG = PROMETHEUS / "prometheus.yml"

_NAME = re.compile(r"\bllmgw_[a-z0-9_]+\b")
#: Inside a label matcher's quotes a name is a value, not a metric (``{job=~"llmgw.*"}``).
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")


@dataclasses.dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    expr: str


def dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}


def panels(doc: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows included."""
    for p in doc.get("panels", ()):
        yield p
        yield from p.get("panels", ())


def substitute(expr: str, values: Mapping[str, str], *, rate: str = "1m", range_: str = "5m") -> str:
    """``expr`` with Grafana's ``$__rate_interval``/``$__interval``/``$__range`` and the dashboard's variables set."""
    out = expr.replace("$__rate_interval", rate).replace("$__interval", rate).replace("$__range", range_)
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        out = out.replace("${" + name + "}", value).replace("$" + name, value)
    return out


def panel_queries(values: Mapping[str, str] | None = None) -> Iterator[Query]:
    """Every panel target's expression in every dashboard, variables substituted from ``values`` when given."""
    for name, doc in dashboards().items():
        for p in panels(doc):
            for t in p.get("targets", ()):
                expr = t["expr"]
                yield Query(name, p["title"], substitute(expr, values) if values is not None else expr)


def variable_queries() -> Iterator[Query]:
    """The query of every query variable (``label_values(metric, label)``)."""
    for name, doc in dashboards().items():
        for v in doc.get("templating", {}).get("list", ()):
            if v.get("type") == "query":
                q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                yield Query(name, "variable " + v["name"], q)


def rules() -> list[dict[str, Any]]:
    """Every rule of every file in ``deploy/prometheus/rules``."""
    return [r for path in sorted(RULES.glob("*.yaml")) for g in yaml.safe_load(path.read_text())["groups"]
            for r in g["rules"]]


def metric_names(expr: str) -> set[str]:
    """The llmgw metric names ``expr`` reads (``label_values(m, l)``'s ``m`` included)."""
    bare = _QUOTED.sub('""', expr)
    return set(_NAME.findall(bare)) | {m for m in _LABEL_VALUES.findall(bare) if m.startswith("llmgw_")}


def exposition_names(text: str) -> set[str]:
    """The sample names an exposition can carry, from its ``# TYPE`` lines (a family with no sample yet included):
    a counter's ``_total``, a histogram's ``_bucket``, ``_sum`` and ``_count``."""
    names: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("# TYPE "):
            continue
        _, _, name, kind = line.split(" ", 3)
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
        elif kind == "summary":
            names |= {name, name + "_sum", name + "_count"}
        elif kind == "counter" and not name.endswith("_total"):
            names.add(name + "_total")
        else:
            names.add(name)
    return names


def scrape_config() -> dict[str, Any]:
    """``deploy/prometheus/prometheus.yml``, parsed (a test points its jobs at its own cluster)."""
    doc: dict[str, Any] = yaml.safe_load(SCRAPE_CONFIG.read_text())
    return doc
