"""deploy/prometheus checked by Debian's promtool: the rules parse, every alert's unit tests pass, the scrape
config is valid (its credential and CA file paths pointed at files that exist, as promtool checks them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmgw.testing import dashboards
from llmgw.testing.prometheus import promtool

pytestmark = pytest.mark.slow


def test_promtool_checks_the_rules() -> None:
    files = sorted(str(p) for p in dashboards.RULES.glob("*.yaml"))
    assert files
    done = promtool("check", "rules", *files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(dashboards.rules())} rules found" in done.stdout


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    files = sorted(str(p.relative_to(dashboards.PROMETHEUS)) for p in dashboards.RULE_TESTS.glob("*.yaml"))
    assert files
    done = promtool("test", "rules", *files, cwd=dashboards.PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "FAILED" not in done.stdout


def test_promtool_unit_tests_fail_when_a_rule_changes(tmp_path: Path) -> None:
    """The tests pin each alert: a threshold moved (the budget's 90 % to 95 %) fails them."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests").mkdir()
    for p in dashboards.RULES.glob("*.yaml"):
        (tmp_path / "rules" / p.name).write_text(p.read_text().replace(">= 0.9\n", ">= 0.95\n"))
    for p in dashboards.RULE_TESTS.glob("*.yaml"):
        (tmp_path / "tests" / p.name).write_text(p.read_text())
    done = promtool("test", "rules", *(f"tests/{p.name}" for p in dashboards.RULE_TESTS.glob("*.yaml")),
                    cwd=tmp_path)
    assert done.returncode != 0
    assert "LlmgwBudgetNearlySpent" in done.stdout + done.stderr


def test_promtool_checks_the_scrape_config(tmp_path: Path) -> None:
    config = yaml.safe_load(dashboards.SCRAPE_CONFIG.read_text())
    (tmp_path / "token").write_text("a-router-token\n")
    (tmp_path / "ca.crt").write_text("")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(tmp_path / "token")
        if "tls_config" in job:
            job["tls_config"]["ca_file"] = str(tmp_path / "ca.crt")
    config["rule_files"] = [str(dashboards.RULES / "*.yaml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert {j["job_name"] for j in config["scrape_configs"]} == {"llmgw-control-plane", "llmgw-routers"}
