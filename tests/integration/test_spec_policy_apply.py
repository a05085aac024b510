"""Issue 24's spec policy on a real server: an operator's model cannot carry code-loading env or flags.

One secure ``llmgw server`` (no agent: nothing here needs a node) serves the module. An operator's
``OPENSSL_CONF`` is a 422 with the sentence and nothing is stored; ``--trust-remote-code`` on a vLLM
model is a 422 until an admin sets ``allow_remote_code`` (a row in the audit log), after which the same
apply is accepted; ``FOO_BAR`` is a 422 until an admin adds it to ``allowed_env`` with the CLI.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.testing.system import LLMGW, System


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("policy"))
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def _token(s: System, name: str, role: str) -> str:
    made = s.request("POST", "/api/v1/users", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    login = s.request("POST", "/api/v1/login", json={"username": name, "password": made.json()["password"]},
                      headers={"Authorization": ""})
    assert login.status_code == 200, login.text
    return str(login.json()["token"])


@pytest.fixture(scope="module")
def operator(server: System) -> str:
    return _token(server, "otto", "operator")


@pytest.fixture(scope="module")
def viewer(server: System) -> str:
    return _token(server, "vera", "viewer")


def _as(s: System, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return s.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)


def _model(name: str, engine: str, **spec: Any) -> dict[str, Any]:
    source = {} if engine == "sim" else {"source": "hf://org/repo"}
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
            "spec": {"engine": engine, "replicas": 0, **source, **spec}}


def _settings(s: System, **change: Any) -> dict[str, Any]:
    r = s.request("PUT", "/api/v1/settings", json=change)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_an_operators_openssl_conf_is_refused_and_nothing_is_stored(server: System, operator: str) -> None:
    """The issue's attack: env OPENSSL_CONF naming a downloaded file is a 422 naming the variable and why."""
    for engine in ("vllm", "sim"):
        r = _as(server, operator, "POST", "/api/v1/models",
                json=_model(f"ssl-{engine}", engine, env={"OPENSSL_CONF": "/var/lib/llmgw/weights/x/evil.cnf"}))
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["param"] == "spec.env.OPENSSL_CONF"
        assert err["message"].startswith("spec.env.OPENSSL_CONF: OPENSSL_CONF would make the engine load or run "
                                         "other code"), err
        assert _as(server, operator, "GET", f"/api/v1/models/ssl-{engine}").status_code == 404


def test_remote_code_is_refused_until_an_admin_allows_it_and_the_change_is_audited(
        server: System, operator: str, viewer: str) -> None:
    """--trust-remote-code (any spelling) is a 422; an operator may not lift it; the admin's change is audited."""
    for arg in ("--trust-remote-code", "--trust-remote-code=true", "--trust-remote"):
        r = _as(server, operator, "POST", "/api/v1/models", json=_model("remote", "vllm", engine_args=[arg]))
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "spec.engine_args[0]"
        assert "makes vllm run or load code" in r.json()["error"]["message"]
        assert "llmgw settings set allow_remote_code true" in r.json()["error"]["message"]
    assert _as(server, operator, "GET", "/api/v1/models/remote").status_code == 404
    refused = _as(server, operator, "PUT", "/api/v1/settings", json={"allow_remote_code": True})
    assert refused.status_code == 403, refused.text
    assert _as(server, viewer, "GET", "/api/v1/settings").json() == {"allowed_env": [], "allow_remote_code": False,
                                                                     "sso_required": False, "sso_break_glass": "admin",
                                                                     "priority_classes": ["interactive", "batch"]}

    done = _settings(server, allow_remote_code=True)
    try:
        assert done["changed"] == ["allow_remote_code"] and done["allow_remote_code"] is True
        assert _as(server, viewer, "GET", "/api/v1/settings").json()["allow_remote_code"] is True
        ok = _as(server, operator, "POST", "/api/v1/models",
                 json=_model("remote", "vllm", engine_args=["--trust-remote-code"]))
        assert ok.status_code == 201, ok.text
        rows = server.get("/api/v1/audit")["items"]
        changes = [(r["action"], r["object"], r["outcome"]) for r in rows if r["action"] == "settings set"]
        # Refused by the permission check before its body was read: the object names no key.
        assert changes == [("settings set", "settings/?", "refused"),
                           ("settings set", "settings/allow_remote_code", "ok")], changes
        assert [r["actor"] for r in rows if r["action"] == "settings set"][-1].startswith("user:admin ")
    finally:
        _settings(server, allow_remote_code=False)
        server.request("DELETE", "/api/v1/models/remote")


def test_an_admin_allows_a_name_with_the_cli_and_the_apply_is_accepted(server: System, operator: str,
                                                                        tmp_path: Path) -> None:
    """FOO_BAR is a 422 with the command that allows it; after `llmgw settings set allowed_env+=FOO_BAR`, a 201."""
    doc = _model("foo", "vllm", env={"FOO_BAR": "1"})
    r = _as(server, operator, "POST", "/api/v1/models", json=doc)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["message"].endswith("an admin may allow it with `llmgw settings set allowed_env+=FOO_BAR`")

    env = {**server.cli_env(), "LLMGW_URL": server.url, "HOME": str(tmp_path), "COLUMNS": "200"}
    cli = subprocess.run([*LLMGW, "settings", "set", "allowed_env+=FOO_BAR"], env=env, capture_output=True,
                         text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    assert "changed: allowed_env" in cli.stdout and "allowed_env: FOO_BAR" in cli.stdout
    try:
        assert _as(server, operator, "POST", "/api/v1/models", json=doc).status_code == 201
        shown = subprocess.run([*LLMGW, "settings", "get"], env=env, capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0 and "allowed_env: FOO_BAR" in shown.stdout, shown.stdout + shown.stderr
        # What no admin may allow is refused at the setting too, saying why.
        bad = server.request("PUT", "/api/v1/settings", json={"allowed_env": ["FOO_BAR", "LD_PRELOAD"]})
        assert bad.status_code == 422 and "LD_PRELOAD would make the engine load" in bad.json()["error"]["message"]
    finally:
        _settings(server, allowed_env=[])
        server.request("DELETE", "/api/v1/models/foo")
