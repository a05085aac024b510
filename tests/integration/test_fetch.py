"""The agent's fetcher against a real ``llmgw mirror`` process: hf snapshots, one .gguf, mirror:// trees.

The mirror is the "hub" (its HF-compatible API on 127.0.0.1); nothing reaches the internet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import fetch
from llmgw.core import errors, sources
from llmgw.testing import hfrepo, procs


@contextlib.contextmanager
def _mirror(tmp: Path, root: Path) -> Iterator[str]:
    """A ``llmgw mirror`` serving ``root``; yields its URL and stops it (by its pid) whatever happens."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    url = f"http://127.0.0.1:{port}"
    with procs.Proc.start(argv, log_path=tmp / "mirror.log") as proc:
        proc.wait_http(url + "/healthz", timeout=30)
        yield url


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "mirror"
    root.mkdir()
    with _mirror(tmp_path, root) as url:
        yield url, root


def _ensure(cache: Path, req: fetch.Request, **kw: Any) -> str:
    async def go() -> str:
        f = fetch.Fetcher(cache, retry_base_s=0.01)
        try:
            return await f.ensure(req, **kw)
        finally:
            await f.close()
    return asyncio.run(go())


def test_hf_snapshot_through_the_mirror(mirror: tuple[str, Path], tmp_path: Path) -> None:
    """hf://org/repo via the mirror: the weights, configs and tokenizer, byte for byte; nothing else."""
    url, root = mirror
    files = hfrepo.sample_files(seed=3)
    extra = {"README.md": b"# readme", "original/consolidated.safetensors": b"x" * 1000, "merges.txt": b"a b\n"}
    hfrepo.write_repo(root, "org/tiny", {**files, **extra})
    seen: list[fetch.Progress] = []
    path = Path(_ensure(tmp_path / "cache", fetch.Request(source=sources.parse("hf://org/tiny"), endpoint=url,
                                                          token="secret-token"), on_progress=seen.append))
    got = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert got == {**files, "merges.txt": b"a b\n"}
    assert path.parent == tmp_path / "cache" and path.name == sources.parse("hf://org/tiny").cache_name()
    assert seen[-1].state == "done" and seen[-1].done_bytes == seen[-1].total_bytes == sum(map(len, got.values()))


def test_hf_one_gguf_by_source_file(mirror: tuple[str, Path], tmp_path: Path) -> None:
    """spec.source_file picks one .gguf of a repo holding several; without it the fetch says to name one."""
    url, root = mirror
    a, b = b"GGUF" + bytes(range(256)) * 40, b"GGUF" + bytes(reversed(range(256))) * 40
    hfrepo.write_repo(root, "org/quants", {"m-Q4.gguf": a, "m-Q8.gguf": b, "README.md": b"r"})
    src = sources.parse("hf://org/quants")
    path = _ensure(tmp_path / "cache", fetch.Request(source=src, file="m-Q8.gguf", endpoint=url))
    assert Path(path).name == "m-Q8.gguf" and Path(path).read_bytes() == b
    with pytest.raises(errors.FetchError, match=r"holds 2 \.gguf files .* spec.source_file"):
        _ensure(tmp_path / "cache", fetch.Request(source=src, endpoint=url))
    with pytest.raises(errors.FetchError, match="no org/absent"):
        _ensure(tmp_path / "cache", fetch.Request(source=sources.parse("hf://org/absent"), endpoint=url))


def test_mirror_tree_and_file(mirror: tuple[str, Path], tmp_path: Path) -> None:
    """mirror://name is the tree under files/name; mirror://name/path one file of it, with its sha256 checked."""
    url, root = mirror
    tree = {"config.json": b"{}", "sub/w.safetensors": bytes(range(200)) * 50, "m.gguf": b"GGUF" * 99}
    hfrepo.write_files(root, "pack", tree)
    path = Path(_ensure(tmp_path / "c", fetch.Request(source=sources.parse("mirror://pack"), endpoint=url)))
    assert {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()} == tree
    one = _ensure(tmp_path / "c", fetch.Request(source=sources.parse("mirror://pack/m.gguf"), endpoint=url,
                                                sha256=hashlib.sha256(tree["m.gguf"]).hexdigest()))
    assert Path(one).name == "m.gguf" and Path(one).read_bytes() == tree["m.gguf"]
    sub = Path(_ensure(tmp_path / "c", fetch.Request(source=sources.parse("mirror://pack/sub"), endpoint=url)))
    assert [p.name for p in sub.iterdir()] == ["w.safetensors"]
    with pytest.raises(errors.FetchError, match="sha256 mismatch"):
        _ensure(tmp_path / "d", fetch.Request(source=sources.parse("mirror://pack/config.json"), endpoint=url,
                                              sha256="0" * 64))
