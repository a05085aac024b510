"""API keys end to end in the control plane: REST and CLI create, list, disable, enable and delete; the router's
doc carries hashes; a key's last use comes back from the router."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time

import openai

from llmgw.core import skew
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**system.cli_env(), "LLMGW_URL": system.url, "COLUMNS": "200"}
    return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=30)


def _router_token(system: System) -> str:
    """A router credential: the endpoints document is served to routers only."""
    made = system.request("POST", "/api/v1/routers", json={"name": "keys-test"})
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def _endpoints(system: System, token: str) -> dict:
    r = system.request("GET", "/api/v1/endpoints", headers={"Authorization": f"Bearer {token}", **skew.headers()})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _auth(system: System, token: str) -> dict:
    return _endpoints(system, token)["auth"]


def test_keys_over_rest_and_cli_reach_the_endpoints_doc(system: System) -> None:
    """Keys made by REST and by the CLI are listed without secrets, and published as hashes with required."""
    router = _router_token(system)
    assert _auth(system, router) == {"required": False, "keys": []}  # a fresh cluster needs no key
    version0 = _endpoints(system, router)["version"]

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
        doc = _endpoints(system, router)
        return doc if len(doc["auth"]["keys"]) == 2 else None

    doc = wait_for(published, timeout=10, what="both keys in the endpoints doc")
    assert doc["version"] > version0 and doc["auth"]["required"] is True
    by_id = {k["id"]: k for k in doc["auth"]["keys"]}
    assert by_id[made["id"]] == {"id": made["id"], "sha256": hashlib.sha256(made["key"].encode()).hexdigest(),
                                 "models": ["sim-a"], "rpm": 60, "tpm": 1000, "priority": 5, "project": "default"}
    assert by_id[batch_id]["sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert made["key"] not in json.dumps(doc) and secret not in json.dumps(doc)

    assert system.request("DELETE", f"/api/v1/keys/{made['id']}").json() == {"deleted": made["id"]}
    gone = _cli(system, "key", "delete", batch_id)
    assert gone.returncode == 0 and f"key/{batch_id} deleted" in gone.stdout, gone.stderr
    wait_for(lambda: _auth(system, router) == {"required": False, "keys": []}, timeout=10,
             what="keys gone from the doc")
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


def test_router_enforces_keys_scope_and_limits(system: System) -> None:
    """Once a key exists the router wants it: 401 without, 403 outside scope, 429 past rpm/tpm, open again after."""
    system.apply(sim_model("sim-k"))
    system.apply(sim_model("sim-other"))
    system.wait_model("sim-k")
    system.wait_model("sim-other")
    system.wait_router("sim-k", 1)
    system.wait_router("sim-other", 1)
    chat = {"model": "sim-k", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert system.request("POST", "/v1/chat/completions", json=chat).status_code == 200  # no key yet: open

    made = system.request("POST", "/api/v1/keys", json={"name": "t", "models": ["sim-k"], "rpm": 3}).json()
    hdr = {"Authorization": f"Bearer {made['key']}"}
    wait_for(lambda: system.request("POST", "/v1/chat/completions", json=chat).status_code == 401,
             timeout=10, what="router requiring keys")
    no_key = system.request("POST", "/v1/chat/completions", json=chat).json()["error"]
    assert no_key["code"] == "invalid_api_key" and "llmgw key create" in no_key["message"]
    bad = system.request("POST", "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer llmgw-x"})
    assert bad.status_code == 401
    models = system.request("GET", "/v1/models", headers=hdr).json()
    assert [m["id"] for m in models["data"]] == ["sim-k"]
    other = system.request("POST", "/v1/chat/completions", json={**chat, "model": "sim-other"}, headers=hdr)
    assert other.status_code == 403 and "sim-k" in other.json()["error"]["message"]
    # The refused requests did not count: 3 pass, the 4th is 429 with Retry-After.
    for _ in range(3):
        assert system.request("POST", "/v1/chat/completions", json=chat, headers=hdr).status_code == 200
    limited = system.request("POST", "/v1/chat/completions", json=chat, headers=hdr)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1

    tpm = system.request("POST", "/api/v1/keys", json={"name": "tpm", "tpm": 5}).json()
    thdr = {"Authorization": f"Bearer {tpm['key']}"}
    wait_for(lambda: system.request("GET", "/v1/models", headers=thdr).status_code == 200, timeout=10,
             what="second key at the router")
    streamed = system.request("POST", "/v1/chat/completions", headers=thdr, json={
        **chat, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}})
    assert streamed.status_code == 200  # spends > 5 tokens (prompt + 5), counted from the stream's usage
    spent = system.request("POST", "/v1/chat/completions", json=chat, headers=thdr)
    assert spent.status_code == 429 and "tokens" in spent.json()["error"]["message"]

    for key in (made, tpm):
        system.request("DELETE", f"/api/v1/keys/{key['id']}")
    wait_for(lambda: system.request("POST", "/v1/chat/completions", json=chat).status_code == 200,
             timeout=10, what="router open again without keys")


def _openai_chat(system: System, secret: str, model: str) -> str:
    client = openai.OpenAI(base_url=system.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    try:
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return out.choices[0].message.content or ""
    finally:
        client.close()


def _refused(system: System, secret: str, model: str) -> openai.AuthenticationError | None:
    try:
        _openai_chat(system, secret, model)
    except openai.AuthenticationError as e:
        return e
    return None


def test_disabled_key_is_refused_by_the_router_until_enabled_and_its_last_use_is_kept(system: System) -> None:
    """Disable (REST and CLI) turns the openai client's calls into 401 once the table republishes; enable opens
    them again with the same secret; ``last_used_at`` is 0 until the first call, then the call's time, shown
    by the CLI as "never" and then "… ago"; an unknown key cannot be disabled (404, exit 1)."""
    system.apply(sim_model("sim-d"))
    system.wait_model("sim-d")
    system.wait_router("sim-d", 1)
    made = system.request("POST", "/api/v1/keys", json={"name": "dis"}).json()
    secret, key_id = made["key"], made["id"]
    assert made["disabled"] is False and made["last_used_at"] == 0
    listed = _cli(system, "key", "list")
    assert listed.returncode == 0 and "never" in listed.stdout, listed.stderr

    before = time.time()
    wait_for(lambda: _refused(system, secret, "sim-d") is None, timeout=10, what="the new key accepted")
    after = time.time()

    def used() -> float | None:
        (key,) = [k for k in system.get("/api/v1/keys")["items"] if k["id"] == key_id]
        return float(key["last_used_at"]) or None

    at = wait_for(used, timeout=10, what="the key's last use recorded")
    assert before - 1 <= at <= after + 1
    listed = _cli(system, "keys", "list")
    assert listed.returncode == 0 and re.search(r"\d+s ago", listed.stdout), listed.stdout

    disabled = system.request("POST", f"/api/v1/keys/{key_id}/disable")
    assert disabled.status_code == 200 and disabled.json()["disabled"] is True, disabled.text
    refusal = wait_for(lambda: _refused(system, secret, "sim-d"), timeout=10, what="the disabled key refused")
    assert refusal.status_code == 401 and "not valid" in str(refusal.message)
    assert [k["disabled"] for k in system.get("/api/v1/keys")["items"] if k["id"] == key_id] == [True]

    enabled = _cli(system, "key", "enable", key_id)
    assert enabled.returncode == 0 and f"key/{key_id} enabled" in enabled.stdout, enabled.stderr
    wait_for(lambda: _refused(system, secret, "sim-d") is None, timeout=10, what="the enabled key accepted")
    again = _cli(system, "keys", "disable", key_id)
    assert again.returncode == 0 and f"key/{key_id} disabled" in again.stdout, again.stderr
    wait_for(lambda: _refused(system, secret, "sim-d"), timeout=10, what="the key disabled by the CLI refused")

    nf = system.request("POST", "/api/v1/keys/key-000000/disable")
    assert nf.status_code == 404 and nf.json()["error"]["code"] == "key_not_found"
    cli = _cli(system, "key", "enable", "key-000000")
    assert cli.returncode == 1 and "does not exist" in cli.stderr
    audit = [(e["action"], e["object"]) for e in system.get("/api/v1/audit")["items"]]
    assert ("key disable", f"key/{key_id}") in audit and ("key enable", f"key/{key_id}") in audit
