"""API keys end to end in the control plane: REST and CLI create, list and delete; the router's doc carries hashes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System


def _cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLMGW_URL": system.url, "COLUMNS": "200"}
    return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=30)


def _auth(system: System) -> dict:
    return system.get("/api/v1/endpoints")["auth"]


def test_keys_over_rest_and_cli_reach_the_endpoints_doc(system: System) -> None:
    """Keys made by REST and by the CLI are listed without secrets, and published as hashes with required."""
    assert _auth(system) == {"required": False, "keys": []}  # a fresh cluster needs no key
    version0 = system.get("/api/v1/endpoints")["version"]

    r = system.request("POST", "/api/v1/keys", json={"name": "alice", "models": ["sim-a"], "rpm": 60,
                                                     "tpm": 1000, "priority": 5})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["id"].startswith("key-") and made["key"].startswith("llmgw-") and len(made["key"]) > 40
    assert made["models"] == ["sim-a"] and made["rpm"] == 60 and made["tpm"] == 1000 and made["priority"] == 5

    cli = _cli(system, "key", "create", "batch", "--models", "sim-a, sim-b", "--tpm", "500", "--priority", "-1")
    assert cli.returncode == 0, cli.stderr
    secret = cli.stdout.strip().splitlines()[-1]
    assert secret.startswith("llmgw-") and "will not be shown again" in cli.stderr

    listed = system.get("/api/v1/keys")["items"]
    assert [k["name"] for k in listed] == ["alice", "batch"]
    text = json.dumps(listed)
    assert made["key"] not in text and secret not in text and "sha256" not in text
    batch_id = listed[1]["id"]
    assert listed[1]["models"] == ["sim-a", "sim-b"] and listed[1]["priority"] == -1
    table = _cli(system, "key", "list")
    assert table.returncode == 0 and "alice" in table.stdout and batch_id in table.stdout, table.stderr

    def published() -> dict | None:
        doc = system.get("/api/v1/endpoints")
        return doc if len(doc["auth"]["keys"]) == 2 else None

    doc = wait_for(published, timeout=10, what="both keys in the endpoints doc")
    assert doc["version"] > version0 and doc["auth"]["required"] is True
    by_id = {k["id"]: k for k in doc["auth"]["keys"]}
    assert by_id[made["id"]] == {"id": made["id"], "sha256": hashlib.sha256(made["key"].encode()).hexdigest(),
                                 "models": ["sim-a"], "rpm": 60, "tpm": 1000, "priority": 5}
    assert by_id[batch_id]["sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert made["key"] not in json.dumps(doc) and secret not in json.dumps(doc)

    assert system.request("DELETE", f"/api/v1/keys/{made['id']}").json() == {"deleted": made["id"]}
    gone = _cli(system, "key", "delete", batch_id)
    assert gone.returncode == 0 and f"key/{batch_id} deleted" in gone.stdout, gone.stderr
    wait_for(lambda: _auth(system) == {"required": False, "keys": []}, timeout=10, what="keys gone from the doc")
    assert system.get("/api/v1/keys")["items"] == []


def test_key_refusals_are_openai_shaped(system: System) -> None:
    """A bad body is 400 naming the field; deleting an unknown key is 404 (REST) and exit 1 (CLI)."""
    bad = system.request("POST", "/api/v1/keys", json={"name": "x", "rpm": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rpm", bad.text
    missing = system.request("POST", "/api/v1/keys", json={"models": []})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "name"
    nf = system.request("DELETE", "/api/v1/keys/key-000000")
    assert nf.status_code == 404 and nf.json()["error"]["code"] == "key_not_found"
    cli = _cli(system, "key", "delete", "key-000000")
    assert cli.returncode == 1 and "does not exist" in cli.stderr
