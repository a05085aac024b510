"""Router auth: who is calling, which models it may use, and the listen-address warning."""

from __future__ import annotations

import hashlib

from llmgw.router import auth, errors
from llmgw.router.table import RouteTable

SECRET = "llmgw-" + "a" * 43
OTHER = "llmgw-" + "b" * 43


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


DOC = {"required": True, "keys": [
    {"id": "key-000001", "sha256": _sha(SECRET), "models": ["qwen"], "rpm": 10, "tpm": 0, "priority": 5},
    {"id": "key-000002", "sha256": _sha(OTHER), "models": [], "rpm": 0, "tpm": 0, "priority": -1},
]}


def _bearer(s: str) -> bytes:
    return f"Bearer {s}".encode()


def test_no_keys_means_anonymous() -> None:
    """Without keys (or without an auth section at all) every request is the anonymous caller."""
    for doc in (None, {}, {"required": False, "keys": []}, "junk"):
        a = auth.Authenticator.from_doc(doc)
        assert not a.required
        assert a.check(None, "anything") is auth.ANONYMOUS


def test_every_key_disabled_refuses_everyone() -> None:
    """Keys required with none usable (every key disabled) is a 401 for all, not an open API."""
    a = auth.Authenticator.from_doc({"required": True, "keys": []})
    assert a.required
    for header in (None, _bearer(SECRET)):
        err = a.check(header, "qwen")
        assert isinstance(err, errors.ApiError) and err.status == 401


def test_missing_key_is_401_saying_how_to_get_one() -> None:
    """A request without a key, while keys exist, is 401 invalid_api_key naming `llmgw key create`."""
    a = auth.Authenticator.from_doc(DOC)
    for header in (None, b"", b"Basic dXNlcg==", b"Bearer "):
        err = a.check(header, "qwen")
        assert isinstance(err, errors.ApiError) and err.status == 401 and err.code == "invalid_api_key"
        assert "llmgw key create" in err.message


def test_unknown_key_is_401() -> None:
    """A well-formed but unknown key is 401, never 403."""
    err = auth.Authenticator.from_doc(DOC).check(_bearer("llmgw-nope"), "qwen")
    assert isinstance(err, errors.ApiError) and err.status == 401 and err.code == "invalid_api_key"


def test_known_key_in_scope() -> None:
    """A known key gets its id, limits and priority; the scheme is case-insensitive."""
    key = auth.Authenticator.from_doc(DOC).check(f"bearer  {SECRET}".encode(), "qwen")
    assert key == auth.KeyInfo(id="key-000001", models=frozenset({"qwen"}), rpm=10, tpm=0, priority=5,
                               project="default")


def test_scope_is_403_naming_allowed_models() -> None:
    """A model outside the key's scope is 403 listing the models it may use; any of the model's names counts."""
    a = auth.Authenticator.from_doc(DOC)
    err = a.check(_bearer(SECRET), "smollm")
    assert isinstance(err, errors.ApiError) and err.status == 403 and "qwen" in err.message
    assert isinstance(a.check(_bearer(SECRET), "small", names=("qwen", "qwen2.5")), auth.KeyInfo)
    assert isinstance(a.check(_bearer(OTHER), "smollm"), auth.KeyInfo)  # empty scope: every model


def test_models_listing_is_filtered() -> None:
    """`visible` keeps only the routes a key may use, matched by name, served name or alias."""
    table = RouteTable.from_doc({"version": 1, "models": [
        {"name": "qwen", "served_name": "qwen2.5", "aliases": ["small"]},
        {"name": "smollm", "served_name": "smollm"}]})
    a = auth.Authenticator.from_doc(DOC)
    scoped = a.check(_bearer(SECRET), "qwen")
    assert isinstance(scoped, auth.KeyInfo)
    assert [m.name for m in a.visible(scoped, table.models)] == ["qwen"]
    assert [m.name for m in a.visible(auth.ANONYMOUS, table.models)] == ["qwen", "smollm"]


def test_malformed_keys_are_skipped() -> None:
    """Entries without a hash are ignored; odd limits read as unlimited."""
    a = auth.Authenticator.from_doc({"required": True, "keys": [
        {"id": "x"}, "junk", {"id": "key-3", "sha256": _sha(SECRET), "rpm": "ten", "models": "qwen"}]})
    key = a.check(_bearer(SECRET), "anything")
    assert key == auth.KeyInfo(id="key-3", project="default")


def test_check_listen_warns_only_beyond_loopback_without_keys() -> None:
    """A warning for 0.0.0.0 without keys; none on loopback, with keys, or when allowed."""
    assert auth.check_listen("0.0.0.0", False, allow_no_auth=False)
    assert auth.check_listen("example.org", False, allow_no_auth=False)
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.2"):
        assert auth.check_listen(host, False, allow_no_auth=False) == []
    assert auth.check_listen("0.0.0.0", True, allow_no_auth=False) == []
    assert auth.check_listen("0.0.0.0", False, allow_no_auth=True) == []
