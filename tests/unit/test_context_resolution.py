"""Contexts on plain data: which one a request uses, the global flag, an old file read (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.cli import contexts

A, B = "http://cp1:8080", "http://cp2:8080"


def creds() -> contexts.Credentials:
    return contexts.Credentials({
        "ops": contexts.Context("ops", [A, B], "admin", "t-admin"),
        "vera": contexts.Context("vera", [A, B], "vera", "t-vera"),
        "cp2:8080": contexts.Context("cp2:8080", [B], "old", "t-old"),
    }, current="vera")


def test_a_named_context_wins_then_the_current_one_then_one_listing_the_url() -> None:
    """LLMGW_CONTEXT picks its context whatever the URL; else the current one if it lists the URL; else the one
    named for the URL; a URL nobody lists has none."""
    c = creds()
    assert contexts.for_url(c, A, {"LLMGW_CONTEXT": "ops"}).name == "ops"  # type: ignore[union-attr]
    assert contexts.for_url(c, "http://elsewhere:1", {"LLMGW_CONTEXT": "ops"}).name == "ops"  # type: ignore[union-attr]
    assert contexts.for_url(c, A + "/", {}).name == "vera"  # type: ignore[union-attr]
    c.current = ""
    assert contexts.for_url(c, B, {}).name == "cp2:8080"  # type: ignore[union-attr]
    assert contexts.for_url(c, A, {}).name == "ops"  # type: ignore[union-attr]  # the first by name
    assert contexts.for_url(c, "http://elsewhere:1", {}) is None


def test_the_flag_is_taken_from_anywhere_before_a_double_dash() -> None:
    """`--context NAME` and `--context=NAME` after the verb go to LLMGW_CONTEXT; after `--` they are arguments."""
    env: dict[str, str] = {}
    assert contexts.take_flag(["get", "models", "--context", "ops", "-o", "json"], env) == ["get", "models", "-o",
                                                                                          "json"]
    assert env == {"LLMGW_CONTEXT": "ops"}
    assert contexts.take_flag(["--context=vera", "get", "nodes"], env) == ["get", "nodes"]
    assert env == {"LLMGW_CONTEXT": "vera"}
    assert contexts.take_flag(["x", "--", "--context", "y"], env) == ["x", "--", "--context", "y"]


def test_an_old_file_reads_as_one_context_per_url_and_the_default_url_is_current(tmp_path: Path) -> None:
    """{URL: {token, user}}: each URL a context named host:port; the default URL's is current; written, v2."""
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"http://127.0.0.1:8080": {"token": "t1", "user": "admin"},
                                B + "/": {"token": "t2", "user": "bob"}, "junk": 3}))
    got = contexts.read(path)
    assert got.current == "127.0.0.1:8080"
    assert got.contexts["cp2:8080"] == contexts.Context("cp2:8080", [B], "bob", "t2")
    contexts.write(got, path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and set(doc["contexts"]) == {"127.0.0.1:8080", "cp2:8080"}
    assert path.stat().st_mode & 0o777 == 0o600
    assert contexts.read(path) == got
