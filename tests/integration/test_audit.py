"""The audit log on a real server: each change via REST or the CLI is a row, read by REST and `llmgw audit`."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import yaml

from llmgw.control.store.store import Store
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


def _env(system: System, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in system.cli_env().items() if k != "SUDO_USER"}
    return {**env, "LLMGW_URL": system.url, "COLUMNS": "250", **extra}


def _cli(system: System, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMGW, *args], env=_env(system, **env), capture_output=True, text=True, timeout=30)


def _audit(system: System, since: int = 0) -> list[dict]:
    return list(system.get(f"/api/v1/audit?since={since}")["items"])


def test_changes_are_audited_with_actor_object_and_outcome(system: System, tmp_path: Path) -> None:
    """Apply, a refused apply, cordon, delete and a key create are rows with actor, object, outcome; no secret."""
    wait_for(lambda: any(n["id"] == "node1" for n in system.get("/api/v1/nodes")["items"]), timeout=20,
             what="node1 registered")
    # What the system's own start did (the admin's login, node1's join) comes before; this test's rows follow.
    before = _audit(system)
    assert {r["action"] for r in before} <= {"login", "node join"}, before
    start = before[-1]["id"] if before else 0

    model_file = tmp_path / "m.yaml"
    model_file.write_text(yaml.safe_dump(sim_model("audited")))
    applied = _cli(system, "apply", "-f", str(model_file), SUDO_USER="tester")
    assert applied.returncode == 0, applied.stderr
    bad = sim_model("audited")
    bad["spec"]["bogus_field"] = 1
    refused = system.request("POST", "/api/v1/models", json=bad, headers={"X-Llmgw-Actor": "alice"})
    assert refused.status_code == 422, refused.text
    cordoned = _cli(system, "cordon", "node1")
    assert cordoned.returncode == 0, cordoned.stderr
    missing = system.request("DELETE", "/api/v1/models/nope")
    assert missing.status_code == 404
    assert system.request("DELETE", "/api/v1/models/audited").status_code == 200
    made = system.request("POST", "/api/v1/keys", json={"name": "ops"})
    assert made.status_code == 201, made.text
    secret, key_id = made.json()["key"], made.json()["id"]

    rows = _audit(system, since=start)
    got = [(r["action"], r["object"], r["outcome"]) for r in rows]
    assert got == [("apply", "model/audited", "ok"), ("apply", "model/audited", "refused"),
                   ("cordon", "node/node1", "ok"), ("delete", "model/nope", "refused"),
                   ("delete", "model/audited", "ok"), ("key create", f"key/{key_id}", "ok")]
    # The proved principal first, then the CLI's claim (through sudo: the invoking user, not root) and the address.
    assert rows[0]["actor"] == "user:admin (sudo:tester@127.0.0.1)"
    assert rows[1]["actor"] == "user:admin (alice@127.0.0.1)"
    assert "bogus_field" in rows[1]["detail"]
    assert rows[2]["actor"].endswith("@127.0.0.1)") and rows[3]["actor"] == "user:admin (127.0.0.1)"  # no claim
    assert "does not exist" in rows[3]["detail"]
    assert rows[0]["detail"] == "" and all(r["at"] > 0 for r in rows)
    assert [r["id"] for r in rows] == sorted(r["id"] for r in rows)
    assert secret not in json.dumps(rows)
    assert _audit(system, since=rows[2]["id"]) == rows[3:]

    printed = _cli(system, "audit")
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    assert all(col in printed.stdout for col in ("TIME", "ACTOR", "ACTION", "OBJECT", "OUTCOME", "DETAIL"))
    for action, obj, outcome in got:
        assert any(action in ln and obj in ln and outcome in ln for ln in lines), (action, obj, outcome)
    assert secret not in printed.stdout


def test_audit_follow_prints_new_rows(system: System) -> None:
    """`llmgw audit -f` keeps printing: a change made after it started shows up in its output."""
    env = _env(system)
    assert system.request("DELETE", "/api/v1/keys/key-first").status_code == 404
    with subprocess.Popen([*LLMGW, "audit", "-f"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as follower:
        seen: list[str] = []
        # A thread reads, so a follower that never prints fails the wait instead of blocking the test.
        reader = threading.Thread(target=lambda: seen.extend(follower.stdout or ()), daemon=True)
        reader.start()
        try:
            # The row made before it started, printed: it has asked once; what comes next it must follow.
            wait_for(lambda: any("key/key-first" in ln for ln in seen), timeout=15, what="the follower's first rows")
            assert system.request("DELETE", "/api/v1/keys/key-none").status_code == 404
            wait_for(lambda: any("key delete" in ln and "key/key-none" in ln and "refused" in ln for ln in seen),
                     timeout=15, what="the follower to print the refused key delete")
            assert follower.poll() is None, "the follower exited instead of following"
        finally:
            follower.terminate()
            follower.wait(timeout=10)
            reader.join(timeout=10)


def test_token_create_is_audited_without_its_secret(tmp_path: Path) -> None:
    """`llmgw token create` (local, no server) writes a token create row naming the token id, never its secret."""
    d = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
    env |= {"HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "xdg"), "SUDO_USER": "tester"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)

    assert run("init", "--data-dir", str(d)).returncode == 0
    made = run("token", "create", "--data-dir", str(d), "--uses", "2", "--node", "gpu7")
    assert made.returncode == 0, made.stderr
    token = made.stdout.split("--token ")[1].split()[0]
    token_id, secret = token.split(".")
    store = Store.open(d)
    try:
        rows = store.list_audit()
    finally:
        store.close()
    assert [(r.actor, r.action, r.object, r.outcome) for r in rows] == \
        [("sudo:tester@local", "token create", f"token/{token_id}", "ok")]
    assert "uses 2" in rows[0].detail and "gpu7" in rows[0].detail
    assert secret not in repr(rows)
