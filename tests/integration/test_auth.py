"""REST authentication as a client meets it: a real ``llmgw server`` (no agents) on loopback, real logins.

Also the server's modes: a first start initialises, ``--insecure`` is loopback-only and says so, and a
standalone router needs its own credential.

One server serves the module (its start is most of the time); each test makes the users and routers it
needs under names of its own. Failed logins come from their own loopback addresses (127.0.0.2...), so
the per-address limit one test trips does not lock the others out.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.control import datadir
from llmgw.core import skew
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW

MUTATING = {"post", "put", "patch", "delete"}
#: The cluster CA's certificate (issue 28) is public: clients read it before they trust the server.
PUBLIC = {("get", "/healthz"), ("post", "/api/v1/login"), ("get", "/api/v1/ca"), ("get", "/api/v1/ca.crt"),
          # Single sign-on makes a credential, so it needs none (tests/integration/test_sso.py).
          ("get", "/api/v1/sso"), ("post", "/api/v1/sso/begin"), ("post", "/api/v1/sso/finish"),
          ("post", "/api/v1/sso/device"), ("post", "/api/v1/sso/device/token")}


def env_for(root: Path) -> dict[str, str]:
    # HOME and XDG_* inside root: nothing a command writes by default lands outside what the tests grep.
    return {**os.environ, "HOME": str(root / "home"), "XDG_DATA_HOME": str(root / "xdg"),
            "XDG_CONFIG_HOME": str(root / "cfg"), "XDG_STATE_HOME": str(root / "state")}


class Server:
    """``llmgw server`` on a data directory initialised in-process (the password kept here, printed nowhere)."""

    def __init__(self, root: Path, *, args: tuple[str, ...] = (), init: bool = True) -> None:
        self.root, self.data_dir = root, root / "data"
        self.password = datadir.init(self.data_dir, hosts=[]).admin_password if init else ""
        self.ports_file = root / "ports.json"
        self.proc = Proc.start([*LLMGW, "server", "--data-dir", str(self.data_dir), "--ports-file",
                                str(self.ports_file), "--http-port", "0", "--agent-port", "0", "--join-port", "0",
                                *args], env=env_for(root), log_path=root / "server.log")
        try:
            wait_for(lambda: self.ports_file.exists() and self.ports_file.read_text(), timeout=30,
                     what="the server's ports file")
        except BaseException:
            self.proc.stop()
            raise
        self.url = f"http://127.0.0.1:{json.loads(self.ports_file.read_text())['http_port']}"

    def login(self, username: str, password: str, *, source: str = "127.0.0.1", **body: Any) -> httpx.Response:
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30) as c:
            return c.post(f"{self.url}/api/v1/login", json={"username": username, "password": password, **body})

    def token(self, username: str = "admin", password: str = "") -> str:
        r = self.login(username, password or self.password)
        assert r.status_code == 200, r.text
        return str(r.json()["token"])

    def call(self, method: str, path: str, *, token: str = "", **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, self.url + path, headers={**headers, **kw.pop("headers", {})}, timeout=30,
                             **kw)

    def admin(self, method: str, path: str, **kw: Any) -> Any:
        r = self.call(method, path, token=self.admin_token, **kw)
        assert r.status_code < 300, r.text
        return r.json()

    @property
    def admin_token(self) -> str:
        if not hasattr(self, "_admin_token"):
            self._admin_token = self.token()
        return self._admin_token

    def user(self, name: str, role: str) -> tuple[str, str]:
        """Makes user ``name`` with ``role``; ``(password, token)``."""
        password = self.admin("POST", "/api/v1/users", json={"name": name, "role": role})["password"]
        return password, self.token(name, password)

    def close(self) -> None:
        self.proc.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("auth"))
    try:
        yield s
    finally:
        s.close()


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


def operations(s: Server) -> list[tuple[str, str]]:
    """Every (method, path) of the server's own OpenAPI document (read with the admin's token)."""
    doc = s.admin("GET", "/api/openapi.json")
    ops = [(m, p) for p, item in doc["paths"].items() for m in item if m in MUTATING | {"get"}]
    assert len(ops) >= 20, ops  # the document lists the API, not an empty shell
    return ops


def test_every_route_in_the_openapi_document_answers_401_without_a_credential(server: Server) -> None:
    """Each operation of /api/openapi.json but health and login: 401 'unauthenticated' with no token or a bad one."""
    ops = operations(server)
    for method, path in ops:
        if (method, path) in PUBLIC:
            continue
        for token in ("", "llmgw_aaaaaaaaaaaa_" + "b" * 32, "not-a-token"):
            r = server.call(method.upper(), concrete(path), token=token, json={})
            assert r.status_code == 401, (method, path, token, r.status_code, r.text)
            err = r.json()["error"]
            assert err["code"] == "unauthenticated" and "llmgw login" in err["message"], err
            assert r.headers["www-authenticate"] == "Bearer"
    for path in ("/metrics", "/api/v1/no-such-route"):
        assert server.call("GET", path).status_code == 401, path
    assert server.call("GET", "/healthz").status_code == 200


def test_a_viewer_reads_but_gets_403_on_every_mutating_route(server: Server) -> None:
    """A viewer's token reads models and nodes; every mutating route (and users, audit) is 403 naming the role."""
    _, viewer = server.user("vera", "viewer")
    assert server.call("GET", "/api/v1/models", token=viewer).status_code == 200
    assert server.call("GET", "/api/v1/nodes", token=viewer).status_code == 200
    for method, path in operations(server):
        if (method, path) in PUBLIC or path == "/api/v1/logout" or method not in MUTATING:
            continue
        r = server.call(method.upper(), concrete(path), token=viewer, json={})
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        err = r.json()["error"]
        assert err["code"] == "forbidden" and err["message"].startswith("user vera has role viewer; "), err
    r = server.call("POST", "/api/v1/models", token=viewer, json={})
    assert r.json()["error"]["message"].startswith("user vera has role viewer; POST /api/v1/models needs operator")
    # Each refused change is in the audit log with who tried it; the anonymous 401s above are not.
    rows = server.admin("GET", "/api/v1/audit?limit=10000")["items"]
    tried = [e for e in rows if e["actor"].startswith("user:vera") and e["outcome"] == "refused"]
    assert any(e["action"] == "apply" and "needs operator" in e["detail"] for e in tried), rows[-5:]
    assert not any(e["outcome"] == "refused" and not e["actor"].startswith(("user:", "router:")) and
                   e["action"] != "login" for e in rows), rows
    for path in ("/api/v1/users", "/api/v1/audit", "/api/v1/routers"):
        assert server.call("GET", path, token=viewer).status_code == 403, path
    _, operator = server.user("otto", "operator")
    assert server.call("GET", "/api/v1/audit", token=operator).status_code == 200
    assert server.call("POST", "/api/v1/keys", token=operator, json={"name": "k"}).status_code == 201
    r = server.call("POST", "/api/v1/users", token=operator, json={"name": "x", "role": "admin"})
    assert r.status_code == 403 and "needs admin" in r.json()["error"]["message"]


def test_only_a_router_token_reads_endpoints_and_it_reaches_nothing_else(server: Server) -> None:
    """A router token reads /api/v1/endpoints, posts router events and scrapes /metrics; users cannot read
    endpoints; the router is refused everything else, and its deleted token is refused within a second."""
    router = server.admin("POST", "/api/v1/routers", json={"name": "edge1"})["token"]
    assert re.fullmatch(r"llmgw_[a-z0-9]{12}_[a-z0-9]{32}", router)
    assert router not in json.dumps(server.admin("GET", "/api/v1/routers"))
    r = server.call("GET", "/api/v1/endpoints?timeout=0", token=router, headers=skew.headers())
    assert r.status_code == 200 and "version" in r.json(), r.text
    assert server.call("POST", "/api/v1/router/events", token=router,
                       json={"router": "edge1", "events": []}).status_code == 200
    assert server.call("GET", "/metrics", token=router).status_code == 200
    for method, path in (("GET", "/api/v1/models"), ("GET", "/api/v1/nodes"), ("POST", "/api/v1/keys"),
                         ("GET", "/api/v1/users"), ("GET", "/api/v1/audit"), ("DELETE", "/api/v1/models/m")):
        r = server.call(method, path, token=router, json={})
        assert r.status_code == 403, (method, path, r.text)
        assert "a router credential reaches only GET /api/v1/endpoints" in r.json()["error"]["message"]
    r = server.call("GET", "/api/v1/endpoints", token=server.admin_token, headers=skew.headers())
    assert r.status_code == 403 and "only routers read it" in r.json()["error"]["message"], r.text
    server.admin("DELETE", "/api/v1/routers/edge1")
    t0 = time.monotonic()
    wait_for(lambda: server.call("GET", "/api/v1/endpoints?timeout=0", token=router,
                                 headers=skew.headers()).status_code == 401,
             timeout=5, what="the deleted router token refused")
    print(f"deleted router token refused after {time.monotonic() - t0:.3f}s")
    assert time.monotonic() - t0 < 1.0


def test_deleted_user_and_role_change_take_effect_at_once(server: Server) -> None:
    """A promoted user can change things from their next request; a deleted user's token is refused (401)."""
    _, token = server.user("pat", "viewer")
    assert server.call("POST", "/api/v1/keys", token=token, json={"name": "k"}).status_code == 403
    server.admin("PUT", "/api/v1/users/pat", json={"role": "operator"})
    wait_for(lambda: server.call("POST", "/api/v1/keys", token=token, json={"name": "k"}).status_code == 201,
             timeout=2, what="the promotion to count")
    server.admin("DELETE", "/api/v1/users/pat")
    wait_for(lambda: server.call("GET", "/api/v1/models", token=token).status_code == 401, timeout=1,
             what="the deleted user's token refused")
    r = server.call("DELETE", "/api/v1/users/admin", token=server.admin_token)
    assert r.status_code == 409 and "last administrator" in r.json()["error"]["message"]


def test_brute_force_logins_are_rate_limited_per_user_and_per_address_and_audited(server: Server) -> None:
    """Five wrong passwords then 429 with Retry-After from that address, even for the right password; the right
    password from an address that never failed logs in; twenty names from one address refuse that address; each
    attempt is an audit row 'login refused' and no log line carries a tried password."""
    password, _ = server.user("carol", "viewer")
    tried = [f"guess-{i}-xyzzy" for i in range(6)]
    for i in range(5):  # per user: carol, from 127.0.0.3
        r = server.login("carol", tried[i], source="127.0.0.3")
        assert r.status_code == 401 and r.json()["error"]["code"] == "login_failed", r.text
    r = server.login("carol", tried[5], source="127.0.0.3")
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= 301
    assert "too many failed logins from 127.0.0.3" in r.json()["error"]["message"]
    assert server.login("carol", password, source="127.0.0.3").status_code == 429  # the guessing address: refused
    r = server.login("carol", password, source="127.0.0.4")  # the right password, another address: in
    assert r.status_code == 200, r.text
    for i in range(20):  # per address: twenty different users from 127.0.0.5
        assert server.login(f"nobody{i}", "wrong", source="127.0.0.5").status_code == 401
    assert server.login("vera", "wrong", source="127.0.0.5").status_code == 429
    assert server.login("admin", server.password, source="127.0.0.6").status_code == 200
    rows = [e for e in server.admin("GET", "/api/v1/audit?limit=10000")["items"] if e["action"] == "login"]
    carol = [e for e in rows if e["object"] == "user/carol"]
    # A login that succeeded names the user it proved: the first, user()'s, and the one from the clean address.
    assert [e["actor"] for e in carol if e["outcome"] == "ok"] == ["user:carol (127.0.0.1)", "user:carol (127.0.0.4)"]
    wrong = [e for e in carol if e["outcome"] == "refused" and "too many" not in e["detail"]]
    assert len(wrong) == 5 and all("127.0.0.3" in e["actor"] for e in wrong), carol  # (the 429s are counted apart)
    log = (server.root / "server.log").read_text()
    assert "failed login as 'carol' from 127.0.0.3" in log
    assert not any(t in log for t in tried) and password not in log


def test_session_cookie_is_strict_and_a_cookie_change_needs_the_same_origin(server: Server) -> None:
    """session=true sets an HttpOnly, SameSite=Strict cookie (not Secure on plain loopback: test_tls_api proves it
    Secure over HTTPS); it reads; a change with it needs Origin equal to the server; logout ends it."""
    r = server.login("admin", server.password, session=True)
    assert r.status_code == 200 and "token" not in r.json(), r.text
    cookie = r.headers["set-cookie"]
    for attribute in ("llmgw_session=", "HttpOnly", "SameSite=strict", "Path=/"):
        assert attribute.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower(), cookie
    session = r.cookies["llmgw_session"]
    jar = {"Cookie": f"llmgw_session={session}"}
    assert server.call("GET", "/api/v1/models", headers=jar).status_code == 200
    r = server.call("POST", "/api/v1/keys", headers=jar, json={"name": "k"})
    assert r.status_code == 403 and "cross-site" in r.json()["error"]["message"], r.text
    evil = server.call("POST", "/api/v1/keys", headers={**jar, "Origin": "http://evil.example"}, json={"name": "k"})
    assert evil.status_code == 403
    same = server.call("POST", "/api/v1/keys", headers={**jar, "Origin": server.url}, json={"name": "k"})
    assert same.status_code == 201, same.text
    out = server.call("POST", "/api/v1/logout", headers={**jar, "Origin": server.url})
    assert out.status_code == 200 and out.json() == {"logged_out": True}
    wait_for(lambda: server.call("GET", "/api/v1/models", headers=jar).status_code == 401, timeout=1,
             what="the logged-out session refused")


def test_the_cli_logs_in_saves_the_token_0600_and_logs_out(server: Server, tmp_path: Path) -> None:
    """`llmgw login --password-stdin` saves a 0600 token in a 0700 dir; `get` uses it; logout ends it and the
    next `get` says to run `llmgw login --url`; LLMGW_TOKEN overrides the file."""
    env = env_for(tmp_path)

    def cli(*args: str, stdin: str = "", extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*LLMGW, *args, "--url", server.url], env={**env, **(extra or {})}, input=stdin,
                              capture_output=True, text=True, timeout=60)

    r = cli("get", "models")
    assert r.returncode == 1 and f"Run `llmgw login --url {server.url}`" in r.stderr, r.stderr
    r = cli("login", "--password-stdin", stdin=server.password + "\n")
    assert r.returncode == 0 and "logged in" in r.stdout, r.stderr
    creds = tmp_path / "cfg" / "llmgw" / "credentials.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600 and stat.S_IMODE(creds.parent.stat().st_mode) == 0o700
    assert server.password not in creds.read_text()
    assert cli("get", "models").returncode == 0
    made = cli("user", "create", "dora", "--role", "viewer")
    assert made.returncode == 0, made.stderr
    dora = made.stdout.strip().splitlines()[-1]
    assert server.login("dora", dora).status_code == 200
    assert cli("logout").returncode == 0
    assert [c["token"] for c in json.loads(creds.read_text())["contexts"].values()] == [""]  # its URL stays
    assert cli("get", "models").returncode == 1
    token = server.token("dora", dora)
    assert cli("get", "models", extra={"LLMGW_TOKEN": token}).returncode == 0
    bad = cli("login", "--password-stdin", stdin="wrong\n")
    assert bad.returncode == 1 and "wrong username or password" in bad.stderr


def test_the_password_is_in_no_file_under_the_data_dir_or_the_log(server: Server) -> None:
    """After logins, users and failed attempts, neither the admin password nor a token is in any file."""
    token = server.token()
    server.login("admin", "not-it-" + "q" * 10, source="127.0.0.7")
    server.call("GET", "/api/v1/models", token=token)
    files = [p for p in server.root.rglob("*") if p.is_file()]
    assert any(p.name == "llmgw.db" for p in files) and any(p.name == "server.log" for p in files)
    for p in files:
        data = p.read_bytes()
        assert server.password.encode() not in data, p
        assert token.encode() not in data, p
        assert b"not-it-qqqq" not in data, p


def test_a_first_secure_start_initialises_and_leaves_the_password_in_a_0600_file(tmp_path: Path) -> None:
    """`llmgw server` on an empty data dir, its output to a file (no terminal), makes the CA and admin and says
    where the password is, never the password itself; it logs in (tests/integration/test_initial_password.py has
    the pipe, the terminal and the file's removal)."""
    s = Server(tmp_path, init=False)
    try:
        wait_for(lambda: "initial-admin-password" in (tmp_path / "server.log").read_text(), timeout=30,
                 what="the password file named")
        out = (tmp_path / "server.log").read_text()
        file = tmp_path / "data" / datadir.INITIAL_PASSWORD
        assert f"password: in {file.resolve()}" in out, out
        password = file.read_text().strip()
        assert stat.S_IMODE(file.stat().st_mode) == 0o600 and password and password not in out
        assert (tmp_path / "data" / "pki" / "ca.key").exists()
        assert s.login("admin", password).status_code == 200
    finally:
        s.close()


def test_insecure_is_refused_off_loopback(tmp_path: Path) -> None:
    """`--insecure --host 0.0.0.0` exits 1 before listening, saying it is for loopback development only."""
    r = subprocess.run([*LLMGW, "server", "--insecure", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d"),
                        "--http-port", "0", "--agent-port", "0"], env=env_for(tmp_path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert "--insecure is for loopback development only" in r.stderr, r.stderr
    assert not (tmp_path / "d" / "pki").exists()


def test_insecure_on_loopback_answers_everyone_and_says_so(tmp_path: Path) -> None:
    """With --insecure every REST answer carries X-Llmgw-Insecure: 1, no credential is needed, the start logs a
    warning, and the CLI warns on stderr."""
    s = Server(tmp_path, args=("--insecure",), init=False)
    try:
        r = httpx.get(f"{s.url}/api/v1/models", timeout=10)
        assert r.status_code == 200 and r.headers["x-llmgw-insecure"] == "1"
        assert httpx.get(f"{s.url}/api/v1/endpoints?timeout=0", headers=skew.headers(), timeout=10).status_code == 200
        assert "WARNING llmgw.serve: INSECURE" in (tmp_path / "server.log").read_text()
        assert not (tmp_path / "data" / "pki").exists()  # nothing initialised: no CA, no admin
        cli = subprocess.run([*LLMGW, "get", "models", "--url", s.url], env=env_for(tmp_path), capture_output=True,
                             text=True, timeout=60)
        assert cli.returncode == 0 and "runs with --insecure" in cli.stderr, cli.stderr
    finally:
        s.close()


def test_a_standalone_router_reads_its_table_with_a_router_token_and_says_what_to_do_without(tmp_path: Path) -> None:
    """`llmgw router --token-file` loads the table; without a token it logs that the
    control plane refused it and how to make a router token, and serves no table."""
    s = Server(tmp_path / "cp")
    procs: list[Proc] = []
    try:
        token = s.admin("POST", "/api/v1/routers", json={"name": "edge"})["token"]
        token_file = tmp_path / "router.token"
        token_file.write_text(token + "\n")
        ports = []
        for args in (["--token-file", str(token_file)], []):
            port = free_port()
            ports.append(port)
            procs.append(Proc.start([sys.executable, "-m", "llmgw", "router", "--control", s.url, "--port", str(port),
                                     "--log-level", "info", *args], env=env_for(tmp_path),
                                    log_path=tmp_path / f"router{len(procs)}.log"))
        wait_for(lambda: "route table v" in procs[0].log_tail(50), timeout=30, what="the router's first table")
        # At start it warns that it has no credential; then the watcher says what the control plane answered.
        wait_for(lambda: "the control plane refused no token (HTTP 401" in procs[1].log_tail(50), timeout=30,
                 what="the tokenless router's refusal")
        assert "no router credential (--token-file or LLMGW_ROUTER_TOKEN)" in procs[1].log_tail(50)
        assert "make one with `llmgw router-token create NAME`" in procs[1].log_tail(50)
        assert "route table v" not in procs[1].log_tail(200)
        assert token not in " ".join(procs[0].popen.args)  # type: ignore[arg-type]  # the token is never argv
    finally:
        for p in procs:
            p.stop()
        s.close()
