"""hf sources against a stand-in HF endpoint (a FlakyHttp dressed as the hub): the API, HEAD metadata, token, verify.

The real mirror is exercised in tests/integration/test_fetch.py; this stand-in can misbehave (drop, corrupt)
and shows what the fetcher sent (Authorization, Range).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import fetch
from llmgw.core import errors, sources
from llmgw.testing.flakyhttp import FlakyHttp, write_file

COMMIT = "c0ffee" * 6 + "abcd"
TOKEN = "hf_secret_token_value"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[FlakyHttp, dict[str, bytes]]]:
    """org/r at main = COMMIT: a config, a tokenizer, two safetensors and a README; sizes only via HEAD."""
    with FlakyHttp(tmp_path / "hub") as srv:
        files = {"config.json": b'{"a": 1}', "tokenizer.json": b"{}", "README.md": b"# r",
                 "model-1.safetensors": write_file(srv.root / "model-1.safetensors", 1 << 20, seed=5),
                 "model-2.safetensors": write_file(srv.root / "model-2.safetensors", 300_000, seed=6)}
        for name, data in files.items():
            (srv.root / name).write_bytes(data)
            url = f"/org/r/resolve/{COMMIT}/{name}"
            srv.aliases[url] = name
            if name.endswith(".safetensors"):
                srv.extra_headers[url] = {"X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                                          "X-Repo-Commit": COMMIT}
        srv.json_routes["/api/models/org/r/revision/main"] = {
            "sha": COMMIT, "siblings": [{"rfilename": n} for n in sorted(files)]}
        yield srv, files


def _ensure(cache: Path, req: fetch.Request) -> str:
    async def go() -> str:
        f = fetch.Fetcher(cache, retry_base_s=0.01, stall_s=5)
        try:
            return await f.ensure(req)
        finally:
            await f.close()
    return asyncio.run(go())


def _req(srv: FlakyHttp, **kw: Any) -> fetch.Request:
    return fetch.Request(source=sources.parse("hf://org/r"), endpoint=srv.url, token=TOKEN, **kw)


def test_snapshot_with_token_pinned_to_the_commit(hub: tuple[FlakyHttp, dict[str, bytes]], tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The API resolves main; every file comes from resolve/<commit>, with the bearer token, never logged."""
    srv, files = hub
    with caplog.at_level(logging.DEBUG):
        path = Path(_ensure(tmp_path / "c", _req(srv)))
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model-1.safetensors", "model-2.safetensors",
                                                      "tokenizer.json"]
    assert all((path / n).read_bytes() == files[n] for n in ("config.json", "model-1.safetensors"))
    gets = [s for s in srv.seen if s.method == "GET"]
    assert {s.path for s in gets[1:]} == {f"/org/r/resolve/{COMMIT}/{n}" for n in files if n != "README.md"}
    assert all(s.authorized for s in srv.seen)
    assert TOKEN not in caplog.text and TOKEN not in repr(_req(srv))


def test_the_hubs_sha256_is_checked(hub: tuple[FlakyHttp, dict[str, bytes]], tmp_path: Path) -> None:
    """Bytes that differ from the X-Linked-Etag sha256 of the resolve HEAD: FetchError, nothing kept."""
    srv, files = hub
    srv.corrupt = True
    want = "|".join(hashlib.sha256(files[n]).hexdigest() for n in ("model-1.safetensors", "model-2.safetensors"))
    with pytest.raises(errors.FetchError, match=f"sha256 mismatch: expected ({want}), got"):
        _ensure(tmp_path / "c", _req(srv))
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [".partial"]
    assert list((tmp_path / "c" / ".partial").iterdir()) == []


def test_a_dropped_hf_file_resumes(hub: tuple[FlakyHttp, dict[str, bytes]], tmp_path: Path) -> None:
    """A connection dropped inside a safetensors file resumes it with Range and it still verifies."""
    srv, files = hub
    srv.drop_after = 400_000
    path = Path(_ensure(tmp_path / "c", fetch.Request(source=sources.parse("hf://org/r/model-1.safetensors"),
                                                      endpoint=srv.url)))
    assert path.is_dir() and (path / "model-1.safetensors").read_bytes() == files["model-1.safetensors"]
    assert srv.ranges(f"/org/r/resolve/{COMMIT}/model-1.safetensors") == ["", "bytes=400000-"]


def test_refusals_name_the_fix(hub: tuple[FlakyHttp, dict[str, bytes]], tmp_path: Path) -> None:
    """No endpoint, an unknown revision, a missing subpath: each says what to do."""
    srv, _ = hub
    with pytest.raises(errors.FetchError, match="--hub-endpoint"):
        _ensure(tmp_path / "c", fetch.Request(source=sources.parse("hf://org/r")))
    with pytest.raises(errors.FetchError, match="no org/r@v9 .*check the name and revision"):
        _ensure(tmp_path / "c", fetch.Request(source=sources.parse("hf://org/r@v9"), endpoint=srv.url))
    with pytest.raises(errors.FetchError, match="no file or folder 'nope'"):
        _ensure(tmp_path / "c", fetch.Request(source=sources.parse("hf://org/r/nope"), endpoint=srv.url))
