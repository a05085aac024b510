"""Single sign-on end to end: a real ``llmgw server`` and a real OpenID Connect provider (the certified
``oidc-provider``, ``tests/oidc``), both on loopback; the user's approvals are posted on the provider's own
pages (``OidcProvider.approve``), never mocked.

One provider and one server serve the module (their starts are most of the time); each test signs in
accounts of its own, so one test's removed group or revoked grant does not touch another's. The server
refreshes every 2 s, so a removed group or an ended provider session ends access within 2 + 1 s + one pass.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.testing.oidcprovider import OidcProvider
from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.system import LLMGW, System

ACCOUNTS = {
    "alice": {"groups": ["llmgw-admins"]},
    "bob": {"groups": ["llmgw-viewers"]},
    "carol": {"groups": ["marketing"]},
    "dave": {"groups": ["llmgw-admins"]},
    "erin": {"groups": ["llmgw-viewers", "team-a"]},
    "frank": {"groups": ["llmgw-admins"]},
    "admin": {"groups": ["llmgw-admins"]},  # an identity provider account named like the local admin
}


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    root = tmp_path_factory.mktemp("idp")
    with OidcProvider(root, accounts=ACCOUNTS) as p:
        yield p


@pytest.fixture(scope="module")
def system(idp: OidcProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("sso"), server_args=[
        "--sso-issuer", idp.issuer, "--sso-client-id", idp.client_id, "--sso-client-secret-file", str(idp.secret_file),
        "--sso-role-map", "llmgw-admins=admin", "--sso-role-map", "llmgw-viewers=viewer",
        "--sso-project-map", "team-a=team-a:member", "--sso-refresh-interval", "2s", "--router-workers", "1"])
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def device_sign_in(system: System, idp: OidcProvider, account: str) -> httpx.Response:
    """The device flow over REST as the CLI runs it, the code approved on the provider's pages by ``account``."""
    with httpx.Client(base_url=system.url, timeout=30) as c:
        started = c.post("/api/v1/sso/device")
        assert started.status_code == 200, started.text
        dev = started.json()
        pending = c.post("/api/v1/sso/device/token", json={"handle": dev["handle"]})
        assert pending.status_code == 200 and pending.json()["status"] == "authorization_pending", pending.text
        idp.approve(dev["verification_uri_complete"], account)
        return c.post("/api/v1/sso/device/token", json={"handle": dev["handle"]})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def audit_lines(system: System, action: str) -> list[dict[str, Any]]:
    return [e for e in system.get("/api/v1/audit?limit=500")["items"] if e["action"] == action]


def test_cli_device_flow_saves_a_token_that_later_commands_use(system: System, idp: OidcProvider,
                                                               tmp_path: Path) -> None:
    """`llmgw login --sso` prints the provider's page and code, waits for the approval made on that page, and
    saves a token; `llmgw get models` then works with it, as alice (an admin by her group)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLMGW_TOKEN", "LLMGW_URL", "LLMGW_CONTEXT")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "cfg"), PYTHONUNBUFFERED="1")
    login = Proc.start([*LLMGW, "login", "--sso", "--url", system.url], env=env, log_path=tmp_path / "login.log")
    try:
        said = wait_for(lambda: re.search(r"or open (\S+), which has the code", login.log_path.read_text()),
                        timeout=30, what="the device code printed")
        assert isinstance(said, re.Match)
        assert re.search(r"open \S+/device in a browser and enter the code [A-Z]{4}-[A-Z]{4}",
                         login.log_path.read_text())
        idp.approve(said.group(1), "alice")
        assert login.popen.wait(timeout=60) == 0, login.log_tail()
    finally:
        login.stop()
    out = login.log_path.read_text()
    assert "signed in to" in out and "as alice through single sign-on (role admin)" in out, out
    creds = (tmp_path / "cfg" / "llmgw" / "credentials.json").read_text()
    assert "llmgw_" in creds and "alice" in creds
    got = subprocess.run([*LLMGW, "get", "models", "--url", system.url], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    # The provider's tokens never reach the CLI: only llmgw's own token is saved.
    assert "eyJ" not in creds


def test_groups_map_to_roles_and_projects(system: System, idp: OidcProvider) -> None:
    """llmgw-admins → admin, llmgw-viewers → viewer (reads, cannot change), team-a → member of project team-a;
    an SSO user has no password."""
    assert system.request("POST", "/api/v1/projects", json={"name": "team-a"}).status_code in (200, 201)
    bob = device_sign_in(system, idp, "bob")
    assert bob.status_code == 200 and bob.json()["role"] == "viewer", bob.text
    with httpx.Client(base_url=system.url, headers=bearer(bob.json()["token"]), timeout=30) as c:
        assert c.get("/api/v1/models").status_code == 200
        refused = c.post("/api/v1/models/x/scale", json={"replicas": 1})
        assert refused.status_code == 403 and "has role viewer" in refused.json()["error"]["message"]
    erin = device_sign_in(system, idp, "erin")
    assert erin.status_code == 200 and erin.json()["role"] == "viewer"
    members = dict((m["user"], m["role"]) for m in system.get("/api/v1/projects/team-a")["members"])
    assert members.get("erin") == "member" and "bob" not in members
    users = {u["name"]: u for u in system.get("/api/v1/users")["items"]}
    assert users["bob"]["role"] == "viewer" and users["bob"]["source"] == "sso"
    assert users["admin"]["source"] == "local"
    reset = system.request("PUT", "/api/v1/users/bob", json={"reset_password": True})
    assert reset.status_code == 400 and "signs in through single sign-on" in reset.json()["error"]["message"]
    no_password = system.request("POST", "/api/v1/login", json={"username": "bob", "password": "!sso"})
    assert no_password.status_code == 401


def test_unmapped_user_refused_with_a_sentence_and_audited(system: System, idp: OidcProvider) -> None:
    carol = device_sign_in(system, idp, "carol")
    assert carol.status_code == 403, carol.text
    err = carol.json()["error"]
    assert err["code"] == "sso_unmapped"
    assert "carol's groups at the identity provider (marketing" in err["message"]
    assert "--sso-role-map GROUP=ROLE" in err["message"]
    lines = [e for e in audit_lines(system, "sso login") if e["object"] == "user/carol"]
    assert lines and lines[-1]["outcome"] == "refused" and "sso_unmapped" in lines[-1]["detail"]


def test_device_code_refused_on_the_providers_page(system: System, idp: OidcProvider) -> None:
    with httpx.Client(base_url=system.url, timeout=30) as c:
        dev = c.post("/api/v1/sso/device").json()
        idp.approve(dev["verification_uri_complete"], "bob", abort=True)
        denied = c.post("/api/v1/sso/device/token", json={"handle": dev["handle"]})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "sso_denied", denied.text
        assert "refused on the identity provider's page" in denied.json()["error"]["message"]
        again = c.post("/api/v1/sso/device/token", json={"handle": dev["handle"]})
        assert again.status_code == 401 and again.json()["error"]["code"] == "sso_unknown_state"
    assert any("sso_denied" in e["detail"] for e in audit_lines(system, "sso login"))


def test_provider_account_cannot_take_over_a_local_user(system: System, idp: OidcProvider) -> None:
    """An identity provider account named ``admin`` does not become the local admin."""
    taken = device_sign_in(system, idp, "admin")
    assert taken.status_code == 403 and taken.json()["error"]["code"] == "sso_name_taken", taken.text
    assert "a local user named 'admin' exists" in taken.json()["error"]["message"]


def test_removed_group_refused_after_the_next_refresh(system: System, idp: OidcProvider) -> None:
    dave = device_sign_in(system, idp, "dave")
    assert dave.status_code == 200
    token = dave.json()["token"]
    assert httpx.get(f"{system.url}/api/v1/models", headers=bearer(token)).status_code == 200
    idp.set_groups("dave", [])
    # Bound: --sso-refresh-interval 2s + a tick of 1s + one pass.
    wait_for(lambda: httpx.get(f"{system.url}/api/v1/models", headers=bearer(token)).status_code == 401,
             timeout=20, what="dave's token refused after his group was removed")
    line = [e for e in audit_lines(system, "sso refresh") if e["object"] == "user/dave"][-1]
    assert line["outcome"] == "refused" and "sso_unmapped" in line["detail"] and "token(s)" in line["detail"]
    assert line["actor"] == "system:sso-refresh"


def test_provider_session_ended_refused_after_the_next_refresh(system: System, idp: OidcProvider) -> None:
    frank = device_sign_in(system, idp, "frank")
    assert frank.status_code == 200
    token = frank.json()["token"]
    assert idp.revoke("frank") >= 1  # the provider's administrator ends frank's grants
    wait_for(lambda: httpx.get(f"{system.url}/api/v1/models", headers=bearer(token)).status_code == 401,
             timeout=20, what="frank's token refused after his provider session ended")
    line = [e for e in audit_lines(system, "sso refresh") if e["object"] == "user/frank"][-1]
    assert "sso_refresh_refused" in line["detail"] and "invalid_grant" in line["detail"]


def test_code_flow_state_is_single_use(system: System, idp: OidcProvider) -> None:
    """The UI's flow over REST: begin, the provider's pages, finish (a session cookie); the same state again
    is refused as a replay, audited."""
    redirect = idp.redirect_uris[0]
    with httpx.Client(base_url=system.url, timeout=30) as c:
        begun = c.post("/api/v1/sso/begin", json={"redirect_uri": redirect})
        assert begun.status_code == 200, begun.text
        back = httpx.URL(idp.approve(begun.json()["authorize_url"], "alice"))
        assert str(back).startswith(redirect)
        state, code = back.params["state"], back.params["code"]
        assert state == begun.json()["state"]
        done = c.post("/api/v1/sso/finish", json={"state": state, "code": code, "redirect_uri": redirect})
        assert done.status_code == 200 and done.json()["user"] == "alice", done.text
        assert "llmgw_session=" in done.headers["set-cookie"] and "HttpOnly" in done.headers["set-cookie"]
        again = c.post("/api/v1/sso/finish", json={"state": state, "code": code, "redirect_uri": redirect})
    assert again.status_code == 401 and again.json()["error"]["code"] == "sso_unknown_state"
    assert "used already" in again.json()["error"]["message"]
    assert any("sso_unknown_state" in e["detail"] for e in audit_lines(system, "sso login"))


def test_local_users_keep_working_and_sso_required_leaves_only_break_glass(system: System) -> None:
    made = system.request("POST", "/api/v1/users", json={"name": "localdan", "role": "viewer"})
    assert made.status_code in (200, 201), made.text
    password = made.json()["password"]
    before = system.request("POST", "/api/v1/login", json={"username": "localdan", "password": password})
    assert before.status_code == 200
    dan_token = before.json()["token"]
    assert httpx.get(f"{system.url}/api/v1/models", headers=bearer(dan_token)).status_code == 200
    assert system.request("PUT", "/api/v1/settings", json={"sso_required": True}).status_code == 200
    try:
        # A local user's token made before counts no more (within the policy's 1 s cache and the token's 0.5 s).
        wait_for(lambda: httpx.get(f"{system.url}/api/v1/models", headers=bearer(dan_token)).status_code == 401,
                 timeout=10, what="localdan's earlier token refused once SSO is required")
        refused = system.request("POST", "/api/v1/login", json={"username": "localdan", "password": password})
        assert refused.status_code == 401
        assert "requires single sign-on" in refused.json()["error"]["message"]
        assert "llmgw login --sso" in refused.json()["error"]["message"]
        admin = system.request("POST", "/api/v1/login", json={"username": "admin", "password": system.admin_password})
        assert admin.status_code == 200, admin.text  # the break-glass local admin
        assert httpx.get(f"{system.url}/api/v1/models", headers=bearer(admin.json()["token"])).status_code == 200
    finally:
        assert system.request("PUT", "/api/v1/settings", json={"sso_required": False}).status_code == 200
    assert system.request("POST", "/api/v1/login", json={"username": "localdan", "password": password}
                          ).status_code == 200
    wait_for(lambda: httpx.get(f"{system.url}/api/v1/models", headers=bearer(dan_token)).status_code == 200,
             timeout=10, what="localdan's token working again once SSO is no longer required")


def test_sso_not_configured_says_how(tmp_path: Path) -> None:
    s = System(tmp_path, server_args=["--router-workers", "1"])
    try:
        s.start_server()
        assert s.get("/api/v1/sso") == {"enabled": False, "issuer": "", "required": False}
        r = httpx.post(f"{s.url}/api/v1/sso/device")
        assert r.status_code == 404 and "--sso-issuer" in r.json()["error"]["message"]
    finally:
        s.close()


def test_server_refuses_a_secret_file_others_may_read(tmp_path: Path, idp: OidcProvider) -> None:
    loose = tmp_path / "secret"
    loose.write_text("s3cret\n")
    loose.chmod(0o644)
    got = subprocess.run([*LLMGW, "server", "--data-dir", str(tmp_path / "d"), "--http-port", "0", "--agent-port",
                          "0", "--join-port", "0", "--sso-issuer", idp.issuer, "--sso-client-id", "llmgw",
                          "--sso-client-secret-file", str(loose)], capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "HOME": str(tmp_path)})
    assert got.returncode != 0
    assert "may be read by its group or others (mode 0644)" in got.stderr and "chmod 600" in got.stderr
    assert "s3cret" not in got.stderr + got.stdout

