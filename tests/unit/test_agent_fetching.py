"""The agent's side of fetched weights, with plain data: the fetcher's request from a shard, the token kept out of
what is stored, progress throttled to once a second, fetched weights marked in the inventory, and RemoveWeights
answered with the fetcher's refusal in the Ack."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfig
from llmgw.agent.fetch import records as fetch_records
from llmgw.agent.session import Commands, Session
from llmgw.agent.supervisor import fetching
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core.errors import FetchError
from llmgw.core.inventory import Inventory, WeightFile
from llmgw.core.shards import FetchProgress, ShardSpec


def spec(source: str, **kw: object) -> ShardSpec:
    return ShardSpec(shard_id="s1", replica_id="r1", model="m", engine="sim", served_name="m", source=source,
                     **kw)  # type: ignore[arg-type]


def test_request_of_each_source_kind() -> None:
    """hf gets endpoint, token and file; mirror its URL and sha256; http its sha256; a local source no request."""
    hf = fetching.request_of(spec("hf://o/r@v1", hub_endpoint="http://m:1", hub_token="t", source_file="q.gguf"))
    assert hf is not None and (hf.source.repo, hf.endpoint, hf.token, hf.file) == ("o/r", "http://m:1", "t", "q.gguf")
    mirror = fetching.request_of(spec("mirror://w/q.gguf", mirror_url="http://m:2", source_sha256="a" * 64,
                                      hub_token="t"))
    assert mirror is not None and (mirror.endpoint, mirror.sha256, mirror.token) == ("http://m:2", "a" * 64, "")
    http = fetching.request_of(spec("https://h/q.gguf", source_sha256="b" * 64, hub_token="t"))
    assert http is not None and (http.source.url, http.sha256, http.token) == ("https://h/q.gguf", "b" * 64, "")
    assert fetching.request_of(spec("file:///srv/q.gguf")) is None and fetching.request_of(spec("")) is None
    assert fetching.is_remote("hf://o/r") and not fetching.is_remote("pkg:x") and not fetching.is_remote("bogus")


def test_stored_spec_has_no_token() -> None:
    """The spec the agent keeps (status, state file) has the hub's token removed, and nothing else changed."""
    s = spec("hf://o/r", hub_token="secret", hub_endpoint="http://m:1")
    kept = fetching.stored(s)
    assert kept.hub_token == "" and kept.hub_endpoint == "http://m:1" and kept.source == s.source
    assert "secret" not in repr(s)


def test_throttle_passes_one_report_a_second_and_every_state_change() -> None:
    """Reports within a second are dropped unless the state changed (stalled, verifying)."""
    now = [0.0]
    t = fetching.Throttle(lambda: now[0])
    p = FetchProgress(done_bytes=1, total_bytes=10)
    assert t.due(p) and not t.due(p)
    now[0] = 0.5
    assert not t.due(p) and t.due(FetchProgress(state="stalled")) and not t.due(FetchProgress(state="stalled"))
    now[0] = 1.6
    assert t.due(FetchProgress(state="stalled"))


def test_mark_fetched_marks_only_what_the_fetcher_holds(tmp_path: Path) -> None:
    """A weight in (or inside) a held cache entry gets its source, cache name and last use; others stay unmarked."""
    cache = tmp_path / "weights"
    held = [fetch_records.Held(name="hf-o-r-abc", source="hf://o/r", size_bytes=10, fetched_at=1.0,
                               last_used_at=1700000000.5)]
    ws = (WeightFile(path=str(cache / "hf-o-r-abc"), size_bytes=10, format="safetensors"),
          WeightFile(path=str(cache / "hf-o-r-abc" / "sub" / "q.gguf"), size_bytes=5, format="gguf"),
          WeightFile(path=str(cache / "copied-by-hand.gguf"), size_bytes=5, format="gguf"),
          WeightFile(path=str(tmp_path / "hf-o-r-abc"), size_bytes=5, format="gguf"))
    marked = fetching.mark_fetched(ws, cache, held)
    assert [(w.fetched_by_llmgw, w.cache_name) for w in marked] == [
        (True, "hf-o-r-abc"), (True, "hf-o-r-abc"), (False, ""), (False, "")]
    assert (marked[0].source, marked[0].last_used_unix) == ("hf://o/r", 1700000000)


def test_remove_weights_is_acked_with_the_refusal() -> None:
    """RemoveWeights is answered when done: ok for a removal, the fetcher's sentence for a refusal."""
    removed: list[str] = []

    async def remove(name: str) -> None:
        if name.startswith(".."):
            raise FetchError(f"refused to remove {name!r}: it is not a name in the weights cache")
        removed.append(name)

    async def nothing(*_a: object) -> None:
        return None

    cfg = AgentConfig(servers=("127.0.0.1:1",), node_id="n1", mgmt_addr="127.0.0.1", state_dir=Path("/nonexistent"))
    session = Session(cfg, inventory=lambda: Inventory(cpu_count=1, memory_total_bytes=1, memory_available_bytes=1),
                      heartbeat=lambda: None,  # type: ignore[arg-type,return-value]
                      on_register=lambda _i: None, agent_version="test",
                      commands=Commands(start=nothing, stop=nothing, drain=nothing, statuses=list,
                                        logs=None, remove_weights=remove))  # type: ignore[arg-type]

    async def main() -> list[pb.Ack]:
        out: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        session.outbox.queue = out
        session._handle(pb.ControlMessage(seq=7, remove_weights=pb.RemoveWeights(cache_name="hf-o-r-abc")))
        session._handle(pb.ControlMessage(seq=8, remove_weights=pb.RemoveWeights(cache_name="../etc")))
        acks = [(await out.get()).ack, (await out.get()).ack]
        return sorted(acks, key=lambda a: a.seq)

    ok, refused = asyncio.run(main())
    assert (ok.seq, ok.ok, ok.error) == (7, True, "")
    assert (refused.seq, refused.ok) == (8, False) and "not a name in the weights cache" in refused.error
    assert removed == ["hf-o-r-abc"]


def test_fetched_copy_is_checked_as_a_local_source_and_remote_never_resolved_alone(tmp_path: Path) -> None:
    """The fetched file or directory is used as a file:// one would be; resolve_source alone refuses a remote source."""
    from llmgw.agent import weights
    from llmgw.core.errors import EngineError

    gguf = tmp_path / "q.gguf"
    gguf.write_bytes(b"GGUF")
    assert weights.resolve_fetched("https://h/q.gguf", str(gguf)) == str(gguf)
    snapshot = tmp_path / "hf-o-r-abc"
    snapshot.mkdir()
    with pytest.raises(EngineError, match="no config.json"):
        weights.resolve_fetched("hf://o/r", str(snapshot))
    (snapshot / "config.json").write_text("{}")
    assert weights.resolve_fetched("hf://o/r", str(snapshot)) == str(snapshot)
    with pytest.raises(EngineError, match="is gone"):
        weights.resolve_fetched("hf://o/r", str(tmp_path / "missing"))
    with pytest.raises(EngineError, match="fetches it into its weights cache"):
        weights.resolve_source("hf://o/r")
