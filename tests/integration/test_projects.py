"""Projects end to end (issue 26): a real ``llmgw server`` with authentication, users logged in, the
in-process router, the openai client.

Who may do what: an owner manages its project's keys and members but cannot set limits; a member
sees and makes only its own keys; a user outside a project cannot describe it; bad limits and an
unknown project are refused naming the field, with nothing changed. And a key of project A neither
lists nor uses a model open only to project B (404 ``model_not_found``, as if it did not exist).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx
import openai
import pytest

from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _login(system: System, name: str, role: str = "viewer") -> str:
    """A user ``name`` with cluster role ``role``; their API token."""
    made = system.request("POST", "/api/v1/users", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    r = system.request("POST", "/api/v1/login", json={"username": name, "password": made.json()["password"]},
                       headers={"Authorization": ""})
    assert r.status_code == 200, r.text
    return str(r.json()["token"])


def _as(system: System, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return system.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)


def _cli(system: System, *args: str, token: str = "") -> subprocess.CompletedProcess[str]:
    env = {**system.cli_env(), "LLMGW_URL": system.url, "COLUMNS": "200"}
    if token:
        env["LLMGW_TOKEN"] = token
    return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=30)


def test_owners_members_and_outsiders_get_what_their_role_allows(system: System) -> None:
    """Owner: members and keys, not limits; member: its own keys; outsider: 404; refusals name the field."""
    owner, member, outsider = (_login(system, n) for n in ("olga", "mike", "nora"))
    made = _cli(system, "project", "create", "team-a", "--description", "Team A")
    assert made.returncode == 0, made.stderr
    assert system.request("POST", "/api/v1/projects", json={"name": "team-b"}).status_code == 201
    for user, role in (("olga", "owner"), ("mike", "member")):
        r = system.request("PUT", "/api/v1/projects/team-a/members", json={"user": user, "role": role})
        assert r.status_code == 200, r.text

    # Only operators and admins create projects; an owner cannot set (raise) its own limits.
    assert _as(system, owner, "POST", "/api/v1/projects", json={"name": "mine"}).status_code == 403
    raised = _as(system, owner, "PUT", "/api/v1/projects/team-a/limits", json={"tokens_per_day": 10**9})
    assert raised.status_code == 403 and "cannot raise its own budget" in raised.json()["error"]["message"]
    assert system.get("/api/v1/projects/team-a")["limits"] == {}
    # The owner adds a viewer and makes keys for anyone in the project; the member only for itself.
    assert _as(system, owner, "PUT", "/api/v1/projects/team-a/members",
               json={"user": "nora", "role": "viewer"}).status_code == 200
    assert _as(system, owner, "DELETE", "/api/v1/projects/team-a/members/nora").status_code == 200
    shared = _as(system, owner, "POST", "/api/v1/keys", json={"name": "svc", "project": "team-a"})
    assert shared.status_code == 201 and shared.json()["user"] == "", shared.text
    own = _as(system, member, "POST", "/api/v1/keys", json={"name": "mine", "project": "team-a"})
    assert own.status_code == 201 and own.json()["user"] == "mike", own.text  # a member's key is its own
    other = _as(system, member, "POST", "/api/v1/keys", json={"name": "x", "project": "team-a", "user": "olga"})
    assert other.status_code == 403 and "member of project 'team-a'" in other.json()["error"]["message"]
    limited = _as(system, member, "POST", "/api/v1/keys", json={"name": "x", "project": "team-a",
                                                                 "limits": {"tokens_per_day": 5}})
    assert limited.status_code == 403
    # Listing: the member sees its own key, the owner both, the admin every key; the outsider none.
    assert [k["name"] for k in _as(system, member, "GET", "/api/v1/keys").json()["items"]] == ["mine"]
    assert sorted(k["name"] for k in _as(system, owner, "GET", "/api/v1/keys").json()["items"]) == ["mine", "svc"]
    assert _as(system, outsider, "GET", "/api/v1/keys").json()["items"] == []
    # The member cannot delete the shared key (it does not see it); the owner can delete the member's.
    assert _as(system, member, "DELETE", f"/api/v1/keys/{shared.json()['id']}").status_code == 404
    # The outsider: no project listed, team-a answered as one that does not exist, no change of any kind.
    assert _as(system, outsider, "GET", "/api/v1/projects").json()["items"] == []
    hidden = _as(system, outsider, "GET", "/api/v1/projects/team-a")
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "project_not_found"
    assert _as(system, member, "GET", "/api/v1/projects/team-b").status_code == 404
    assert [p["name"] for p in _as(system, member, "GET", "/api/v1/projects").json()["items"]] == ["team-a"]
    refused = _as(system, outsider, "POST", "/api/v1/keys", json={})  # refused before its body is read
    assert refused.status_code == 403 and refused.json()["error"]["message"].startswith("user nora has role viewer; ")
    described = _cli(system, "project", "describe", "team-a", token=owner)
    assert described.returncode == 0 and "mike (member)" in described.stdout and "svc" in described.stdout, \
        described.stderr

    # Bad limits and an unknown project: 422/404 naming the field; nothing changed.
    before = system.get("/api/v1/projects/team-a")
    for bad, param in (({"tokens_per_day": -1}, "limits.tokens_per_day"),
                       ({"spend_per_month": "lots"}, "limits.spend_per_month"),
                       ({"tokens_per_day": 10**18}, "limits.tokens_per_day"),
                       ({"tokens_per_day": 5, "tokens_per_week": 5}, "limits.tokens_per_week")):
        r = system.request("PUT", "/api/v1/projects/team-a/limits", json=bad)
        assert r.status_code == 422 and r.json()["error"]["param"] == param, (bad, r.text)
    assert system.get("/api/v1/projects/team-a") == before
    nokey = system.request("POST", "/api/v1/keys", json={"name": "k", "project": "nope"})
    assert nokey.status_code == 404 and "project 'nope'" in nokey.json()["error"]["message"]
    badkey = system.request("POST", "/api/v1/keys", json={"name": "k", "limits": {"requests_per_day": -5}})
    assert badkey.status_code == 422 and badkey.json()["error"]["param"] == "limits.requests_per_day"
    assert len(system.get("/api/v1/keys")["items"]) == 2

    # The admin sets limits (CLI), partially; 0 removes one; a key's limits by PATCH.
    set_ = _cli(system, "project", "set-limits", "team-a", "--tokens-per-day", "20000", "--concurrent-requests", "4")
    assert set_.returncode == 0, set_.stderr
    cleared = system.request("PUT", "/api/v1/projects/team-a/limits", json={"concurrent_requests": 0})
    assert cleared.json()["limits"] == {"tokens_per_day": 20000}
    patched = system.request("PATCH", f"/api/v1/keys/{own.json()['id']}", json={"limits": {"requests_per_day": 100}})
    assert patched.status_code == 200 and patched.json()["limits"] == {"requests_per_day": 100}
    assert _as(system, owner, "PATCH", f"/api/v1/keys/{own.json()['id']}",
               json={"limits": {"requests_per_day": 1000}}).status_code == 403

    # The CLI: a key for a member with its own budget, then updated; listed by project.
    cli = _cli(system, "key", "create", "cli-key", "--project", "team-a", "--user", "mike", "--tokens-per-day", "500")
    assert cli.returncode == 0 and cli.stdout.strip().startswith("llmgw-"), cli.stderr
    (cli_key,) = [k for k in system.get("/api/v1/keys?project=team-a")["items"] if k["name"] == "cli-key"]
    assert (cli_key["user"], cli_key["limits"]) == ("mike", {"tokens_per_day": 500})
    upd = _cli(system, "key", "update", cli_key["id"], "--requests-per-day", "7", "--tokens-per-day", "0", "--rpm", "9")
    assert upd.returncode == 0, upd.stderr
    listed = _cli(system, "key", "list", "--project", "team-a", "-o", "json")
    (row,) = [k for k in json.loads(listed.stdout) if k["id"] == cli_key["id"]]
    assert (row["limits"], row["rpm"]) == ({"requests_per_day": 7}, 9)
    assert _cli(system, "key", "update", cli_key["id"], "--tokens-per-day", "5", token=member).returncode == 1

    # A project with keys is not deleted (the sentence says what to do); default never.
    busy = system.request("DELETE", "/api/v1/projects/team-a")
    assert busy.status_code == 409 and "delete them" in busy.json()["error"]["message"]
    assert system.request("DELETE", "/api/v1/projects/default").status_code == 409
    assert system.request("DELETE", "/api/v1/projects/team-b").json() == {"deleted": "team-b"}
    rows = system.get("/api/v1/audit?limit=1000")["items"]
    assert {"project create", "project set-limits", "project member set", "key update"} <= {e["action"] for e in rows}


def _chat(system: System, secret: str, model: str) -> str:
    client = openai.OpenAI(base_url=system.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    try:
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return out.choices[0].message.content or ""
    finally:
        client.close()


def test_a_key_cannot_list_or_use_a_model_open_only_to_another_project(system: System) -> None:
    """spec.access.projects [team-b]: team-b's key lists and uses it; team-a's gets 404 model_not_found."""
    for name in ("team-a", "team-b"):
        assert system.request("POST", "/api/v1/projects", json={"name": name}).status_code == 201
    priced = sim_model("sim-priced")
    priced["spec"]["pricing"] = {"input_per_1m": "cheap"}
    refused = system.request("POST", "/api/v1/models", json=priced)
    assert refused.status_code in (400, 422) and refused.json()["error"]["param"] == "spec.pricing.input_per_1m", \
        refused.text
    assert system.request("GET", "/api/v1/models/sim-priced").status_code == 404  # nothing changed
    closed = sim_model("sim-b")
    closed["spec"]["access"] = {"projects": ["team-b"]}
    closed["spec"]["pricing"] = {"input_per_1m": 0.5, "output_per_1m": 1.5}
    system.apply(closed)
    system.apply(sim_model("sim-open"))
    for name in ("sim-b", "sim-open"):
        system.wait_model(name)
        system.wait_router(name, 1)
    a = system.request("POST", "/api/v1/keys", json={"name": "a", "project": "team-a"}).json()["key"]
    b = system.request("POST", "/api/v1/keys", json={"name": "b", "project": "team-b"}).json()["key"]
    wait_for(lambda: system.request("GET", "/v1/models", headers={"Authorization": f"Bearer {b}"}).status_code
             == 200, timeout=10, what="the keys at the router")

    def listed(secret: str) -> list[str]:
        return sorted(m["id"] for m in system.request("GET", "/v1/models",
                                                      headers={"Authorization": f"Bearer {secret}"}).json()["data"])

    assert listed(b) == ["sim-b", "sim-open"] and listed(a) == ["sim-open"]
    spec = system.get("/api/v1/models/sim-b")["spec"]
    assert spec["access"] == {"projects": ["team-b"]} and spec["pricing"]["output_per_1m"] == 1.5
    assert _chat(system, b, "sim-b") and _chat(system, a, "sim-open")
    with pytest.raises(openai.NotFoundError) as e:
        _chat(system, a, "sim-b")
    assert e.value.code == "model_not_found"
