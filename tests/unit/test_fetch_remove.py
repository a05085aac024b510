"""Fetcher.remove: only what llmgw fetched, directly in the cache, goes; everything else is refused and left intact."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest

from llmgw.agent import fetch
from llmgw.core import errors, sources
from llmgw.testing.flakyhttp import FlakyHttp, write_file


@pytest.fixture
def fetched(tmp_path: Path) -> tuple[fetch.Fetcher, str, Path]:
    """A cache holding one fetched entry; returns the fetcher, the entry's name and the fetched file."""
    with FlakyHttp(tmp_path / "srv") as srv:
        write_file(srv.root / "m.gguf", 4096)
        f = fetch.Fetcher(tmp_path / "cache", retry_base_s=0.01, policy=srv.policy())

        async def go() -> str:
            try:
                return await f.ensure(fetch.Request(source=sources.parse(f"{srv.url}/m.gguf")))
            finally:
                await f.close()

        path = asyncio.run(go())
    (held,) = f.held()
    return f, held.name, Path(path)


def test_removes_what_it_fetched(fetched: tuple[fetch.Fetcher, str, Path]) -> None:
    """An entry llmgw fetched is deleted and forgotten; removing it again is a no-op."""
    f, name, path = fetched
    f.remove(name)
    assert not path.exists() and not (f.cache_dir / name).exists()
    assert f.held() == []
    with pytest.raises(errors.FetchError, match="not recorded"):
        f.remove(name)   # forgotten: a later removal is refused as a stranger's, harmlessly


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink_out", "copied_by_hand", "nested"])
def test_refuses_what_it_did_not_fetch(fetched: tuple[fetch.Fetcher, str, Path], tmp_path: Path, how: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """../x, an absolute path, a symlink out of the cache, a hand-copied directory: refused, logged, intact."""
    f, name, own = fetched
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"keep me")
    cache = f.cache_dir
    if how == "dotdot":
        target, arg = outside, "../precious"
    elif how == "absolute":
        target, arg = outside, str(outside)
    elif how == "nested":
        target, arg = own, f"{name}/{own.name}"
    elif how == "symlink_out":
        # A symlink under a name the record knows (as if someone swapped the entry for a link).
        os.rename(cache / name, tmp_path / "moved")
        os.symlink(outside, cache / name)
        target, arg = outside, name
    else:
        hand = cache / "hf-org-copied-by-hand-0123456789ab"
        hand.mkdir()
        (hand / "weights.bin").write_bytes(b"keep me")
        target, arg = hand, hand.name
    before = sorted(p.name for p in target.iterdir()) if target.is_dir() else target.read_bytes()
    with caplog.at_level(logging.WARNING, logger="llmgw.agent.fetch"), pytest.raises(errors.FetchError) as caught:
        f.remove(arg)
    assert "refused to remove" in str(caught.value)
    says = {"dotdot": "it is a path", "absolute": "it is a path", "nested": "it is a path",
            "symlink_out": "is a symlink", "copied_by_hand": "is not recorded"}[how]
    assert says in str(caught.value)
    assert any("refused to remove" in r.getMessage() for r in caplog.records)
    after = sorted(p.name for p in target.iterdir()) if target.is_dir() else target.read_bytes()
    assert after == before
    if how == "symlink_out":
        assert (cache / name).is_symlink()
    if how not in ("symlink_out",):
        assert own.exists()


def test_a_hand_copied_entry_under_our_name_is_not_used(tmp_path: Path) -> None:
    """A directory under a source's cache name that llmgw did not record is refused, not served as weights."""
    src = sources.parse("https://example.invalid/m.gguf")
    cache = tmp_path / "cache"
    (cache / src.cache_name()).mkdir(parents=True)
    f = fetch.Fetcher(cache)
    with pytest.raises(errors.FetchError, match="llmgw did not fetch it"):
        asyncio.run(f.ensure(fetch.Request(source=src)))


def test_a_download_verified_just_before_a_crash_is_adopted(fetched: tuple[fetch.Fetcher, str, Path]) -> None:
    """Renamed into place but not yet recorded when the agent died: the verified sidecar lets it be adopted."""
    f, name, path = fetched
    (held,) = f.held()
    partial = f.cache_dir / ".partial" / name
    partial.mkdir(parents=True)
    (partial / "sidecar.json").write_text(json.dumps({"source": held.source, "verified": True, "rel": path.name,
                                                      "files": {path.name: {"size": 4096}}}))
    (f.cache_dir / ".llmgw-fetched.json").write_text('{"version": 1, "entries": {}}')
    again = fetch.Fetcher(f.cache_dir)
    got = asyncio.run(again.ensure(fetch.Request(source=sources.parse(held.source))))   # no server runs now
    assert got == str(path) and [h.name for h in again.held()] == [name] and not partial.exists()
