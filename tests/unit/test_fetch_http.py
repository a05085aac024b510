"""The fetcher against a real, misbehaving HTTP server: resume, single-flight, verification, disk, stalls."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent import fetch
from llmgw.agent.fetch import guard as fetch_guard
from llmgw.core import errors, sources
from llmgw.testing.flakyhttp import FlakyHttp, write_file

MIB = 1 << 20


@pytest.fixture
def served(tmp_path: Path) -> Iterator[FlakyHttp]:
    with FlakyHttp(tmp_path / "srv") as srv:
        yield srv


def _fetcher(cache: Path, **kw: Any) -> fetch.Fetcher:
    kw.setdefault("stall_s", 5.0)
    kw.setdefault("retry_base_s", 0.01)
    kw.setdefault("progress_period_s", 0.0)
    # The servers here are on loopback, which a fetcher refuses unless its settings allow it.
    kw.setdefault("policy", fetch_guard.policy_of(["127.0.0.1"]))
    return fetch.Fetcher(cache, **kw)


def _run(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(make())


async def _ensure(f: fetch.Fetcher, req: fetch.Request, **kw: Any) -> str:
    try:
        return await f.ensure(req, **kw)
    finally:
        await f.close()


def _req(srv: FlakyHttp, rel: str, **kw: Any) -> fetch.Request:
    return fetch.Request(source=sources.parse(f"{srv.url}/{rel}"), **kw)


def test_resumes_after_a_dropped_connection(served: FlakyHttp, tmp_path: Path) -> None:
    """A connection dropped mid-transfer is resumed with Range from where it stopped; the sha256 matches."""
    data = write_file(served.root / "m.gguf", 3 * MIB + 123)
    served.drop_after = MIB + 7
    req = _req(served, "m.gguf", sha256=hashlib.sha256(data).hexdigest())
    states: list[str] = []
    path = _run(lambda: _ensure(_fetcher(tmp_path / "cache"), req, on_progress=lambda p: states.append(p.state)))
    assert Path(path).read_bytes() == data
    assert served.drops == 1
    assert served.ranges("/m.gguf") == ["", f"bytes={MIB + 7}-"]
    assert states[-1] == "done" and "stalled" in states   # the drop was reported while it was retried
    assert not (tmp_path / "cache" / ".partial" / req.source.cache_name()).exists()


def test_resumes_through_a_drop_on_every_response(served: FlakyHttp, tmp_path: Path) -> None:
    """A server that drops every response after 512 KiB still delivers the file: progress resets the attempts."""
    data = write_file(served.root / "big.bin", 3 * MIB)
    served.drop_after, served.drop_every = 512 * 1024, True
    path = _run(lambda: _ensure(_fetcher(tmp_path / "c", max_attempts=2), _req(served, "big.bin")))
    assert Path(path).read_bytes() == data
    assert served.ranges()[1:] == [f"bytes={n * 512 * 1024}-" for n in range(1, 6)]


def test_eight_concurrent_callers_cause_one_download(served: FlakyHttp, tmp_path: Path) -> None:
    """Eight ensure() calls for one source at once: exactly one GET, one path, progress heard by all eight."""
    data = write_file(served.root / "m.gguf", 2 * MIB)
    served.rate_bps = 8 * MIB   # slow enough that all eight join while it runs
    heard: list[list[fetch.Progress]] = [[] for _ in range(8)]

    async def go() -> list[str]:
        f = _fetcher(tmp_path / "c")
        try:
            return await asyncio.gather(*(f.ensure(_req(served, "m.gguf"), on_progress=heard[i].append)
                                          for i in range(8)))
        finally:
            await f.close()

    paths = _run(go)
    assert len(set(paths)) == 1 and Path(paths[0]).read_bytes() == data
    assert served.count("GET") == 1
    for h in heard:
        assert h[-1].state == "done" and h[-1].done_bytes == h[-1].total_bytes == len(data)


def test_wrong_sha256_discards_the_download(served: FlakyHttp, tmp_path: Path) -> None:
    """Bytes that do not hash to the expected sha256: FetchError with both hashes, nothing kept, nothing held."""
    data = write_file(served.root / "m.gguf", MIB)
    served.corrupt = True
    want = hashlib.sha256(data).hexdigest()
    got = hashlib.sha256(bytes(b ^ 0xFF for b in data)).hexdigest()
    f = _fetcher(tmp_path / "c")
    failed: list[fetch.Progress] = []
    with pytest.raises(errors.FetchError) as caught:
        _run(lambda: _ensure(f, _req(served, "m.gguf", sha256=want),
                             on_progress=lambda p: failed.append(p) if p.state == "failed" else None))
    assert f"expected {want}, got {got}" in str(caught.value) and "discarded" in str(caught.value)
    assert failed and failed[-1].message == str(caught.value)
    assert not (tmp_path / "c" / ".partial" / sources.parse(f"{served.url}/m.gguf").cache_name()).exists()
    assert [p.name for p in (tmp_path / "c").iterdir() if p.name != ".partial"] == []
    assert f.held() == []


def test_disk_refusal_says_the_numbers(served: FlakyHttp, tmp_path: Path) -> None:
    """Not enough free disk: refused before any GET, with what is needed and what is free, in GiB."""
    write_file(served.root / "m.gguf", 3 * MIB)
    f = _fetcher(tmp_path / "c", free_bytes=lambda p: 2 * MIB)
    with pytest.raises(errors.FetchError) as caught:
        _run(lambda: _ensure(f, _req(served, "m.gguf")))
    assert str(caught.value).startswith(f"needs 0.0 GiB, {tmp_path / 'c'} has 0.0 GiB free")
    assert served.count("GET") == 0

    gib = 1 << 30
    big = _fetcher(tmp_path / "c", free_bytes=lambda p: int(9.8 * gib))
    big._flights["other"] = fetch.fetching._Flight(meter=fetch.meter.Meter(clock=lambda: 0.0, period_s=1.0),
                                                  planned=True)
    big._flights["other"].meter.start(total=int(3 * gib), done=0)
    with pytest.raises(errors.FetchError, match=r"needs 14\.2 GiB, .* has 9\.8 GiB free, and 3\.0 GiB of it is "
                                                r"promised to fetches in flight"):
        big._check_disk("mine", int(14.2 * gib))
    big._check_disk("mine", int(6.7 * gib))   # 9.8 free - 3.0 promised holds 6.7 ...
    with pytest.raises(errors.FetchError, match=r"needs 7\.5 GiB"):
        big._check_disk("mine", int(7.5 * gib))   # ... but not 7.5, though 9.8 GiB are free


def test_disk_is_checked_when_only_the_get_tells_the_size(served: FlakyHttp, tmp_path: Path) -> None:
    """A server without HEAD: the size from the GET's headers is checked against free disk before the body."""
    write_file(served.root / "m.gguf", 3 * MIB)
    served.head_status = 405
    served.rate_bps = MIB   # so a body read despite the refusal would show in the partial file
    f = _fetcher(tmp_path / "c", free_bytes=lambda p: 2 * MIB)
    with pytest.raises(errors.FetchError, match="needs 0.0 GiB"):
        _run(lambda: _ensure(f, _req(served, "m.gguf")))
    part = tmp_path / "c" / ".partial" / sources.parse(f"{served.url}/m.gguf").cache_name() / "files" / "m.gguf"
    assert served.count("GET") == 1 and part.stat().st_size == 0


def test_a_new_fetcher_resumes_a_cancelled_download(served: FlakyHttp, tmp_path: Path) -> None:
    """An agent stopped mid-download (its task cancelled): a new Fetcher on the cache resumes with Range."""
    data = write_file(served.root / "m.gguf", 4 * MIB)
    served.rate_bps = 2 * MIB
    req = _req(served, "m.gguf", sha256=hashlib.sha256(data).hexdigest())
    part = tmp_path / "c" / ".partial" / req.source.cache_name() / "files" / "m.gguf"

    async def stop_midway() -> None:
        f = _fetcher(tmp_path / "c")
        midway = asyncio.Event()
        task = asyncio.create_task(f.ensure(req, on_progress=lambda p: p.done_bytes >= MIB and midway.set()))
        await midway.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await f.close()

    _run(stop_midway)
    kept = part.stat().st_size
    assert 0 < kept < len(data)
    served.rate_bps = None
    path = _run(lambda: _ensure(_fetcher(tmp_path / "c"), req))
    assert Path(path).read_bytes() == data
    assert served.ranges() == ["", f"bytes={kept}-"]
    assert served.seen[-1].if_range.startswith('"')   # resumed only if the file is still the same


def test_a_caller_after_the_last_one_left_gets_a_fresh_fetch(served: FlakyHttp, tmp_path: Path) -> None:
    """The only caller is cancelled and another asks at once: it gets the file (resumed), not the cancellation."""
    data = write_file(served.root / "m.gguf", 4 * MIB)
    served.rate_bps = 4 * MIB
    req = _req(served, "m.gguf")

    async def go() -> str:
        f = _fetcher(tmp_path / "c")
        try:
            midway = asyncio.Event()
            first = asyncio.create_task(f.ensure(req, on_progress=lambda p: p.done_bytes >= MIB and midway.set()))
            await midway.wait()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            served.rate_bps = None
            return await f.ensure(req)
        finally:
            await f.close()

    assert Path(_run(go)).read_bytes() == data
    assert len(served.ranges()) == 2 and served.ranges()[1].startswith("bytes=")


def test_a_changed_upstream_file_restarts_from_zero(served: FlakyHttp, tmp_path: Path) -> None:
    """A partial from an older version of the file is not spliced: If-Range gets the new file whole."""
    write_file(served.root / "m.gguf", 2 * MIB, seed=1)
    served.drop_after = MIB
    req = _req(served, "m.gguf")
    f = _fetcher(tmp_path / "c", max_attempts=1)
    with pytest.raises(errors.FetchError, match="gave up after 1 attempts"):
        _run(lambda: _ensure(f, req))
    new = write_file(served.root / "m.gguf", 2 * MIB, seed=2)
    path = _run(lambda: _ensure(_fetcher(tmp_path / "c"), req))
    assert Path(path).read_bytes() == new
    assert served.ranges() == ["", f"bytes={MIB}-"] and served.seen[-1].if_range


def test_a_stall_is_reported_then_recovered(served: FlakyHttp, tmp_path: Path) -> None:
    """No byte for stall_s: the progress says "stalled" with the reason, the retry resumes and completes."""
    data = write_file(served.root / "m.gguf", MIB)
    served.rate_bps = 0
    seen: list[fetch.Progress] = []

    def heard(p: fetch.Progress) -> None:
        seen.append(p)
        if p.state == "stalled":
            served.rate_bps = None   # the server recovers once the fetcher has noticed

    path = _run(lambda: _ensure(_fetcher(tmp_path / "c", stall_s=0.3), _req(served, "m.gguf"), on_progress=heard))
    assert Path(path).read_bytes() == data
    stalled = [p for p in seen if p.state == "stalled"]
    assert stalled and "no byte from 127.0.0.1" in stalled[0].message and "retrying" in stalled[0].message
    assert seen[-1].state == "done"
    assert served.count("GET") == 2


def test_not_found_fails_at_once(served: FlakyHttp, tmp_path: Path) -> None:
    """A 404 is not retried: FetchError naming the URL and what to check."""
    with pytest.raises(errors.FetchError, match="404: no such file; check spec.source"):
        _run(lambda: _ensure(_fetcher(tmp_path / "c"), _req(served, "absent.gguf")))
    assert served.count("GET") == 0 and served.count("HEAD") == 1


def test_held_sources_are_not_fetched_again(served: FlakyHttp, tmp_path: Path) -> None:
    """A second ensure of a held source returns it without a request and moves its last use."""
    write_file(served.root / "m.gguf", 1000)
    clock = iter(range(100, 200))
    f = _fetcher(tmp_path / "c", wall=lambda: float(next(clock)))
    first = _run(lambda: f.ensure(_req(served, "m.gguf")))
    again = _run(lambda: _ensure(f, _req(served, "m.gguf")))
    assert first == again and served.count("GET") == 1
    (held,) = f.held()
    assert held.source == f"{served.url}/m.gguf" and held.size_bytes == 1000
    assert held.last_used_at > held.fetched_at
    record = json.loads((tmp_path / "c" / ".llmgw-fetched.json").read_text())
    assert list(record["entries"]) == [held.name]
