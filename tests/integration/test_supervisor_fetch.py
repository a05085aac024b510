"""The supervisor with a remote source: FETCHING with progress, then the launch of a real sim engine.

The fetcher is a small stand-in with the real one's interface (``ensure``,
``remove``, ``held``): these tests are about what the supervisor does with a
fetch (its states, its reports, the token kept off disk, a stop that ends a
wait), not about downloading, which ``llmgw.agent.fetch``'s own tests cover.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.fetch import records as fetch_records
from llmgw.core.errors import FetchError
from llmgw.core.shards import ShardSpec, ShardState
from llmgw.testing.supervised import SupervisorHarness, torn_down

S = ShardState
pytestmark = pytest.mark.slow
TOKEN = "hf_secret_token_never_on_disk"


class FakeFetcher:
    """Hands out ``path`` once ``release`` is set (or raises ``fail``); records what it was asked."""

    def __init__(self, path: Path) -> None:
        self.path, self.fail = path, ""
        self.release = asyncio.Event()
        self.asked: list[fetch_records.Request] = []
        self.cancelled = 0
        self.removed: list[str] = []
        self.progress: Callable[[fetch_records.Progress], None] | None = None

    async def ensure(self, req: fetch_records.Request, *,
                     on_progress: Callable[[fetch_records.Progress], None] | None = None) -> str:
        self.asked.append(req)
        self.progress = on_progress
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail:
            raise FetchError(self.fail)
        return str(self.path)

    def remove(self, name: str) -> None:
        if name != "hf-org-repo-0123456789ab":
            raise FetchError(f"refused to remove {name!r}: llmgw did not fetch it")
        self.removed.append(name)

    def held(self) -> list[Any]:
        return []


class Harness(SupervisorHarness):
    def __init__(self, tmp_path: Path) -> None:
        self.clock_now = 1000.0
        weights = tmp_path / "weights" / "hf-org-repo-0123456789ab"
        weights.parent.mkdir(parents=True)
        weights.write_bytes(b"GGUF fake weights the sim engine never reads")
        self.fetcher = FakeFetcher(weights)
        super().__init__(tmp_path / "run", grace_s=5.0, fetcher=self.fetcher, clock=lambda: self.clock_now)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with torn_down(Harness(tmp_path)) as h:
        yield h


def spec(shard_id: str, *, source: str = "hf://org/repo") -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r-" + shard_id, model="m", engine="sim", served_name="m",
                     api_key="k", source=source, hub_endpoint="http://127.0.0.1:9/hub", hub_token=TOKEN)


def progress(done: int, *, state: str = "fetching", message: str = "") -> fetch_records.Progress:
    return fetch_records.Progress(done_bytes=done, total_bytes=1000, rate_bps=250e6, eta_s=3.0, state=state,
                                  message=message)


def settle(h: Harness) -> None:
    h.run(asyncio.sleep(0.05))


def test_remote_source_fetches_then_launches_and_keeps_the_token_off_disk(harness: Harness,
                                                                          tmp_path: Path) -> None:
    """FETCHING with throttled progress, then STARTING and READY on the fetched path; no token on disk or in status."""
    h = harness
    st = h.run(h.sup.start(spec("a")))
    assert st.state is S.FETCHING and st.fetch is not None and st.pid == 0
    assert st.spec is not None and st.spec.hub_token == ""
    settle(h)
    req = h.fetcher.asked[0]
    assert (req.source.repo, req.endpoint, req.token) == ("org/repo", "http://127.0.0.1:9/hub", TOKEN)
    assert h.fetcher.progress is not None
    h.fetcher.progress(progress(100))
    h.fetcher.progress(progress(200))          # within the same second: not reported
    h.fetcher.progress(progress(300, state="stalled", message="no byte for 30 s; retrying"))  # a new state: at once
    h.clock_now += 1.5
    h.fetcher.progress(progress(410))
    fetching = [s for s in h.seen if s.shard_id == "a" and s.state is S.FETCHING]
    assert [s.fetch.done_bytes for s in fetching if s.fetch] == [0, 100, 300, 410]
    assert fetching[2].fetch is not None and fetching[2].fetch.state == "stalled"
    assert "41% of 1.0 KB" in fetching[3].message
    h.fetcher.release.set()
    ready = h.wait_state("a", S.READY)
    assert ready.fetch is None and ready.pid > 0
    states = h.states("a")
    assert states[states.index(S.STARTING) - 1] is S.FETCHING and S.FAILED not in states
    state_file = (tmp_path / "run" / "a.json").read_text()
    assert TOKEN not in state_file and "hf://org/repo" in state_file
    assert all(s.spec is None or s.spec.hub_token == "" for s in h.seen)


def test_fetch_failure_fails_the_shard_with_the_fetchers_sentence(harness: Harness) -> None:
    """A fetch that fails is FAILED with the fetcher's sentence, and nothing is launched."""
    h = harness
    h.fetcher.fail = "sha256 of model.gguf is 1234..., not the expected abcd...; the file was discarded"
    h.run(h.sup.start(spec("b", source="https://weights.example/m/model.gguf")))
    h.fetcher.release.set()
    failed = h.wait_state("b", S.FAILED)
    assert failed.message == h.fetcher.fail and failed.pid == 0 and failed.fetch is None
    assert S.STARTING not in h.states("b")


def test_stop_while_fetching_ends_the_wait_and_launches_nothing(harness: Harness) -> None:
    """A stop of a FETCHING shard answers STOPPED at once, cancels its wait, and no engine ever starts."""
    h = harness
    h.run(h.sup.start(spec("c")))
    settle(h)
    stopped = h.run(asyncio.wait_for(h.sup.stop("c", reason="replica deleted"), 5))
    assert stopped.state is S.STOPPED and "while fetching" in stopped.message
    assert h.fetcher.cancelled == 1
    h.fetcher.release.set()
    settle(h)
    assert h.sup.status("c").state is S.STOPPED and h.sup.pids() == {}
    # A drain of a fetching shard ends the same way: there is nothing in flight to wait for.
    h.fetcher.release.clear()
    h.run(h.sup.start(spec("d")))
    settle(h)
    assert h.run(asyncio.wait_for(h.sup.drain("d", timeout_s=30), 5)).state is S.STOPPED


def test_remove_weights_passes_the_fetchers_refusal(harness: Harness) -> None:
    """RemoveWeights removes what the fetcher owns and raises its refusal for anything else."""
    h = harness
    h.run(h.sup.remove_weights("hf-org-repo-0123456789ab"))
    assert h.fetcher.removed == ["hf-org-repo-0123456789ab"]
    with pytest.raises(FetchError, match="did not fetch it"):
        h.run(h.sup.remove_weights("../etc"))
