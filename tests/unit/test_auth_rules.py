"""The REST auth's parts as plain data: the permission table, the login limiter, token format, the cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.control.auth import credentials, passwords, principals, tokens
from llmgw.control.auth import middleware as auth_mw
from llmgw.control.auth.principals import Principal
from llmgw.control.http import audit as audit_http
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredUser

ADMIN = Principal("user", "ann", principals.ADMIN)
OPERATOR = Principal("user", "otto", principals.OPERATOR)
VIEWER = Principal("user", "vera", principals.VIEWER)
ROUTER = Principal("router", "r1", principals.ROUTER)


def allowed(method: str, path: str) -> set[str]:
    need = principals.required(method, path)
    assert need is not None, (method, path)
    return {p.name for p in (ADMIN, OPERATOR, VIEWER, ROUTER) if need.allows(p)}


def test_the_permission_table_by_method_and_path() -> None:
    """Reads are viewer's, changes operator's, users and routers admin's; endpoints and events routers' only."""
    assert principals.required("GET", "/healthz") is None and principals.required("POST", "/api/v1/login") is None
    assert principals.required("POST", "/healthz") is not None  # only GET/HEAD of health is open
    # The cluster CA's certificate: read before a client trusts the server (issue 28); nothing else under it.
    assert principals.required("GET", "/api/v1/ca") is None and principals.required("GET", "/api/v1/ca.crt") is None
    assert principals.required("POST", "/api/v1/ca") is not None
    assert principals.required("GET", "/api/v1/ca/x") is not None
    assert allowed("GET", "/api/v1/models") == {"ann", "otto", "vera"}
    assert allowed("HEAD", "/api/v1/nodes") == {"ann", "otto", "vera"}
    assert allowed("POST", "/api/v1/models") == {"ann", "otto"}
    assert allowed("POST", "/api/v1/nodes/n1/drain") == {"ann", "otto"}
    # Keys and projects: every user reaches them, the handlers check the project role (issue 26).
    assert allowed("DELETE", "/api/v1/keys/key-1") == {"ann", "otto", "vera"}
    assert allowed("PUT", "/api/v1/projects/p/limits") == {"ann", "otto", "vera"}
    assert allowed("GET", "/api/v1/audit") == {"ann", "otto"}
    for method, path in (("GET", "/api/v1/users"), ("POST", "/api/v1/users"), ("PUT", "/api/v1/users/x"),
                         ("DELETE", "/api/v1/users/x"), ("GET", "/api/v1/routers"), ("POST", "/api/v1/routers"),
                         ("DELETE", "/api/v1/routers/r")):
        assert allowed(method, path) == {"ann"}, (method, path)
    assert allowed("GET", "/api/v1/endpoints") == {"r1"}
    assert allowed("POST", "/api/v1/router/events") == {"r1"}
    assert allowed("POST", "/api/v1/router/signals") == {"r1"}
    assert allowed("GET", "/metrics") == {"ann", "otto", "vera", "r1"}
    # The API's shape holds no secret: its document and the docs page need no credential (issue 24).
    assert principals.required("GET", "/api/openapi.json") is None and principals.required("GET", "/api/docs") is None
    assert allowed("POST", "/api/v1/logout") == {"ann", "otto", "vera"}
    assert allowed("GET", "/api/v1/usersx") == {"ann", "otto", "vera"}  # a prefix is a path segment, not a string
    assert principals.required("DELETE", "/api/v1/endpoints").allows(principals.INSECURE)  # type: ignore[union-attr]


def test_a_refusal_names_who_what_and_the_next_step() -> None:
    """403 messages: the user and role, the method and path, the role needed and the command that grants it."""
    need = principals.required("POST", "/api/v1/models")
    assert need is not None
    assert auth_mw.forbidden_message(VIEWER, need, "POST", "/api/v1/models") == (
        "user vera has role viewer; POST /api/v1/models needs operator; an administrator can change the role "
        "with `llmgw user set-role vera operator`")
    assert "only GET /api/v1/endpoints" in auth_mw.forbidden_message(ROUTER, need, "POST", "/api/v1/models")
    endpoints = principals.required("GET", "/api/v1/endpoints")
    assert endpoints is not None
    assert "only routers read it" in auth_mw.forbidden_message(ADMIN, endpoints, "GET", "/api/v1/endpoints")


def test_credentials_come_from_bearer_or_the_session_cookie_and_origin_must_match_host() -> None:
    """Bearer wins over the cookie; the cookie is found among others; Origin must name the Host exactly."""
    assert auth_mw.credential({"authorization": "Bearer abc", "cookie": "llmgw_session=s"}) == ("abc", False)
    assert auth_mw.credential({"cookie": "a=1; llmgw_session=s2; b=2"}) == ("s2", True)
    assert auth_mw.credential({"authorization": "Basic abc"}) == ("", False)
    assert auth_mw.credential({"authorization": "Bearer "}) == ("", False)
    assert auth_mw.same_origin({"origin": "http://127.0.0.1:8080", "host": "127.0.0.1:8080"})
    assert not auth_mw.same_origin({"origin": "http://evil.example", "host": "127.0.0.1:8080"})
    assert not auth_mw.same_origin({"host": "127.0.0.1:8080"})
    assert not auth_mw.same_origin({"origin": "null", "host": "127.0.0.1:8080"})


def test_token_format_and_what_is_stored() -> None:
    """``llmgw_<12>_<32>`` of [a-z0-9]; only well-formed tokens give an id; the digest is sha256 hex."""
    token_id, token = tokens.new_token()
    assert len(token) == len("llmgw_") + 12 + 1 + 32 and token.startswith(f"llmgw_{token_id}_")
    assert tokens.token_id(token) == token_id
    for bad in ("", "llmgw_short_x", token + "x", token.upper(), "llmgw-" + token[6:]):
        assert tokens.token_id(bad) is None, bad
    other = token[:-1] + ("1" if token.endswith("0") else "0")  # one character changed, never the same one
    assert len(tokens.digest(token)) == 64 and tokens.digest(token) != tokens.digest(other)


def test_the_limiter_refuses_after_five_failures_for_the_rest_of_the_window() -> None:
    """Four failures pass; the fifth makes retry_after the time until the oldest leaves the 300 s window."""
    now = [1000.0]
    lim = passwords.Limiter(limit=5, window_s=300.0, clock=lambda: now[0])
    for _ in range(4):
        lim.fail("user:bob")
        now[0] += 10
    assert lim.retry_after("user:bob") == 0
    lim.fail("user:bob")
    assert lim.retry_after("user:bob") == pytest.approx(1000.0 + 300 - now[0])
    assert lim.retry_after("user:ann") == 0  # per key
    now[0] = 1000.0 + 300.5  # the first failure left the window: four remain
    assert lim.retry_after("user:bob") == 0


def test_failures_from_one_address_never_refuse_another(tmp_path: Path) -> None:
    """Twenty made-up names from one address refuse that address (429 for the right password too), not the admin
    from another; one IPv6 host's /64 counts as one address."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    auth = credentials.Auth(db, limiter=passwords.Limiter(address_limit=20))

    async def main() -> None:
        store.put_user(StoredUser("admin", principals.ADMIN, passwords.hash_password("pw"), 0.0))
        for i in range(20):
            with pytest.raises(credentials.LoginRefused) as e:
                await auth.login(f"made-up-{i}", "x", peer="2001:db8::1", session=True)
            assert e.value.retry_after == 0
        with pytest.raises(credentials.LoginRefused) as e:  # another address of the same /64
            await auth.login("admin", "pw", peer="2001:db8::ffff", session=True)
        assert e.value.retry_after > 0
        assert (await auth.login("admin", "pw", peer="2001:db8:0:1::1", session=True)).user == "admin"
        assert (await auth.login("admin", "pw", peer="127.0.0.1", session=True)).user == "admin"

    try:
        asyncio.run(main())
    finally:
        db.close()
        store.close()


def test_address_key_is_the_address_or_an_ipv6_slash_64() -> None:
    """IPv4 as it is, an IPv4-mapped IPv6 as its IPv4, other IPv6 as its /64, anything else unchanged."""
    assert passwords.address_key("10.1.2.3") == "10.1.2.3"
    assert passwords.address_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert passwords.address_key("2001:db8::5") == passwords.address_key("2001:db8::7") == "2001:db8::/64"
    assert passwords.address_key("unknown") == "unknown"


def test_the_limiter_is_bounded_in_keys() -> None:
    """A flood of made-up usernames keeps at most max_keys entries (the oldest goes)."""
    lim = passwords.Limiter(max_keys=3, clock=lambda: 0.0)
    for i in range(10):
        lim.fail(f"user:u{i}")
    assert len(lim._failures) == 3


def test_verify_is_false_for_an_unknown_user_and_a_wrong_password() -> None:
    """A right password verifies; a wrong one, and any password for no user (the dummy hash), do not."""
    h = passwords.hash_password("right horse")
    assert passwords.verify(h, "right horse")
    assert not passwords.verify(h, "wrong")
    assert not passwords.verify(None, "right horse")
    assert not passwords.verify("not-a-hash", "x")


def test_the_audit_actor_puts_the_principal_first() -> None:
    """``user:admin (sudo:alice@127.0.0.1)``; a login (no principal) keeps ``claim@peer``."""
    assert audit_http.actor("sudo:alice", "127.0.0.1", principal="user:admin") == "user:admin (sudo:alice@127.0.0.1)"
    assert audit_http.actor("", "10.0.0.2", principal="router:r1") == "router:r1 (10.0.0.2)"
    assert audit_http.actor("alice", "127.0.0.1") == "alice@127.0.0.1"


def test_a_token_deleted_behind_the_cache_stops_working_within_the_cache_time(tmp_path: Path) -> None:
    """Looked up once, a token is served from the cache for CACHE_S, then the store's answer (gone) counts;
    a token this process revokes is refused at once; a role change shows after the cache time."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    now = [5000.0]
    auth = credentials.Auth(db, clock=lambda: now[0])

    async def main() -> None:
        store.put_user(StoredUser("bob", principals.VIEWER, passwords.hash_password("pw"), 0.0))
        token, _ = await auth.issue(kind="user", subject="bob", ttl_s=60)
        assert await auth.principal(token) == Principal("user", "bob", "viewer", tokens.token_id(token) or "")
        store.delete_api_token(tokens.token_id(token) or "")  # behind the cache's back
        now[0] += credentials.CACHE_S / 2
        assert await auth.principal(token) is not None
        now[0] += credentials.CACHE_S
        assert await auth.principal(token) is None
        other, _ = await auth.issue(kind="user", subject="bob", ttl_s=60)
        assert await auth.principal(other) is not None
        assert await auth.revoke(tokens.token_id(other) or "")
        assert await auth.principal(other) is None  # revoked here: no cache time
        expiring, _ = await auth.issue(kind="user", subject="bob", ttl_s=60)
        now[0] += 61
        assert await auth.principal(expiring) is None

    try:
        asyncio.run(main())
    finally:
        db.close()
        store.close()


def test_login_refuses_without_saying_which_part_was_wrong_and_then_rate_limits(tmp_path: Path) -> None:
    """A wrong password and an unknown user read the same; after five failures for a user, an address that took
    part is refused even with the right password, and an address that did not still logs in (slowed)."""
    store = Store.open(tmp_path)
    db = StoreThread(store)
    auth = credentials.Auth(db)

    async def main() -> None:
        store.put_user(StoredUser("bob", principals.OPERATOR, passwords.hash_password("pw"), 0.0))
        done = await auth.login("bob", "pw", peer="10.0.0.1", session=False)
        assert done.user == "bob" and done.role == "operator" and await auth.principal(done.token) is not None
        messages = set()
        for name in ("bob", "nobody"):
            with pytest.raises(credentials.LoginRefused) as e:
                await auth.login(name, "nope", peer="10.0.0.1", session=False)
            messages.add(e.value.message.replace(name, "NAME"))
        assert len(messages) == 1
        for _ in range(4):  # with the one above, five for bob
            with pytest.raises(credentials.LoginRefused):
                await auth.login("bob", "nope", peer="10.0.0.2", session=False)
        for guessed in ("10.0.0.1", "10.0.0.2"):
            with pytest.raises(credentials.LoginRefused) as e:
                await auth.login("bob", "pw", peer=guessed, session=True)
            assert e.value.retry_after > 0 and f"too many failed logins from {guessed}" in e.value.message
        clean = await auth.login("bob", "pw", peer="10.0.0.3", session=True)
        assert clean.user == "bob"

    try:
        asyncio.run(main())
    finally:
        db.close()
        store.close()


def test_a_login_is_cross_site_when_origin_or_else_referer_names_another_host() -> None:
    """Origin decides when sent ('null' included); without it, Referer; with neither (not a browser's page): not."""
    host = {"host": "cp.example:8080"}
    assert auth_mw.cross_site_login(host) == ""
    assert auth_mw.cross_site_login({**host, "origin": "https://cp.example:8080"}) == ""
    assert auth_mw.cross_site_login({**host, "referer": "https://CP.example:8080/ui/login"}) == ""
    for bad in ({"origin": "https://evil.example"}, {"origin": "null"}, {"referer": "https://evil.example/x"},
                {"origin": "https://evil.example", "referer": "https://cp.example:8080/ui/login"}):
        assert "cross-site login" in auth_mw.cross_site_login({**host, **bad}), bad
