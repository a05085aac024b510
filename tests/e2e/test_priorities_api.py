"""Priority classes and weights through the control plane (issue 32): the cluster setting, REST and CLI for keys
and projects, the refusals, and what the routers' table carries."""

from __future__ import annotations

import subprocess

from llmgw.core import skew
from llmgw.testing.system import LLMGW, System


def _cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**system.cli_env(), "LLMGW_URL": system.url, "COLUMNS": "200"}
    return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=30)


_ROUTER_TOKENS: dict[str, str] = {}


def _auth(system: System) -> dict:
    if system.url not in _ROUTER_TOKENS:  # a router's credential, made once: the table is served to routers only
        made = system.request("POST", "/api/v1/routers", json={"name": "prio-test"})
        assert made.status_code == 201, made.text
        _ROUTER_TOKENS[system.url] = made.json()["token"]
    r = system.request("GET", "/api/v1/endpoints", headers={"Authorization": f"Bearer {_ROUTER_TOKENS[system.url]}",
                                                             **skew.headers()})
    assert r.status_code == 200, r.text
    return dict(r.json()["auth"])


def test_classes_and_weights_over_rest_and_cli_reach_the_table(system: System) -> None:
    # The cluster's classes: the default, a refusal naming the setting, then an operator's own.
    assert system.get("/api/v1/settings")["priority_classes"] == ["interactive", "batch"]
    bad = system.request("PUT", "/api/v1/settings", json={"priority_classes": ["batch", "interactive"]})
    assert bad.status_code == 422 and "priority_classes" in bad.text and "end with 'batch'" in bad.text
    cli = _cli(system, "settings", "set", "priority_classes", "premium,interactive,batch")
    assert cli.returncode == 0, cli.stderr
    assert "priority_classes: premium, interactive, batch" in cli.stdout
    assert system.get("/api/v1/settings")["priority_classes"] == ["premium", "interactive", "batch"]

    assert system.request("POST", "/api/v1/projects", json={"name": "team-a"}).status_code == 201
    cli = _cli(system, "project", "set-priority", "team-a", "--priority-class", "premium", "--weight", "3")
    assert cli.returncode == 0, cli.stderr
    assert "priority class premium, weight 3" in cli.stdout
    cli = _cli(system, "key", "create", "loader", "--project", "team-a", "--priority-class", "batch")
    assert cli.returncode == 0, cli.stderr
    key_id = next(k["id"] for k in system.get("/api/v1/keys")["items"] if k["name"] == "loader")
    cli = _cli(system, "key", "update", key_id, "--weight", "0.5")
    assert cli.returncode == 0, cli.stderr
    assert "priority class batch, weight 0.5" in cli.stdout

    listed = system.get("/api/v1/priorities")
    assert listed == {"classes": ["premium", "interactive", "batch"],
                      "keys": [{"name": key_id, "priority_class": "batch", "weight": 0.5}],
                      "projects": [{"name": "team-a", "priority_class": "premium", "weight": 3.0}]}
    cli = _cli(system, "priorities")
    assert cli.returncode == 0 and "premium, interactive, batch" in cli.stdout and "team-a" in cli.stdout

    auth = _auth(system)
    assert auth["priority_classes"] == ["premium", "interactive", "batch"]
    (key,) = [k for k in auth["keys"] if k["id"] == key_id]
    assert (key["priority_class"], key["weight"]) == ("batch", 0.5)
    (project,) = [p for p in auth["projects"] if p["name"] == "team-a"]
    assert (project["priority_class"], project["weight"], project["limits"]) == ("premium", 3.0, {})

    # Refusals say what was wrong and what to do.
    unknown = system.request("PUT", f"/api/v1/keys/{key_id}/priority", json={"priority_class": "urgent"})
    assert unknown.status_code == 422 and "priority_classes" in unknown.json()["error"]["message"]
    weight = system.request("PUT", "/api/v1/projects/team-a/priority", json={"weight": -1})
    assert weight.status_code == 422 and "0.01" in weight.json()["error"]["message"]
    missing = system.request("PUT", "/api/v1/projects/nope/priority", json={"weight": 2})
    assert missing.status_code == 404
    cli = _cli(system, "project", "set-priority", "team-a")
    assert cli.returncode == 1 and "--priority-class" in cli.stderr

    # Unset, and forgotten with the key.
    cleared = system.request("PUT", "/api/v1/projects/team-a/priority", json={"priority_class": "", "weight": 0})
    assert cleared.status_code == 200 and cleared.json() == {"name": "team-a", "priority_class": "", "weight": 0.0}
    assert system.request("DELETE", f"/api/v1/keys/{key_id}").status_code == 200
    assert system.get("/api/v1/priorities")["keys"] == [] and system.get("/api/v1/priorities")["projects"] == []
    assert all(p["name"] != "team-a" for p in _auth(system).get("projects", []))

    # A project's owner manages its keys, not its share of the fleet.
    made = system.request("POST", "/api/v1/users", json={"name": "bob", "role": "viewer"})
    assert made.status_code == 201, made.text
    assert system.request("PUT", "/api/v1/projects/team-a/members",
                          json={"user": "bob", "role": "owner"}).status_code == 200
    token = system.request("POST", "/api/v1/login", json={"username": "bob", "password": made.json()["password"]})
    assert token.status_code == 200, token.text
    refused = system.request("PUT", "/api/v1/projects/team-a/priority", json={"priority_class": "batch"},
                             headers={"Authorization": f"Bearer {token.json()['token']}"})
    assert refused.status_code == 403 and "operator or admin" in refused.json()["error"]["message"]
