"""Fetching weights as the control plane sees it, with plain data: the remote fields a shard gets, no startup
timeout while fetching, the FetchStalled condition, the `get replicas` phase and the describe bar, the hub's
token from a file or the environment."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llmgw import serve
from llmgw.cli import tables
from llmgw.control import conditions as cond
from llmgw.control.reconcile import decide
from llmgw.control.reconcile import decisions as d
from llmgw.control.state import Member, NodeView, Phase, ReplicaRecord
from llmgw.control.status import fetch_of
from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import Inventory, WeightFile
from llmgw.core.shards import FetchProgress, ShardState, ShardStatus
from llmgw.core.specs import ModelSpec

TOKEN = "hf_token_for_the_hub"
HUB = decide.Hub(endpoint="http://mirror:9000", mirror_url="http://mirror:9000", token=TOKEN)
CFG = decide.Config(node_grace_s=30, resend_s=10, hub=HUB)
SHA = "cd" * 32


def spec(source: str, **kw: object) -> ModelSpec:
    return dataclasses.replace(ModelSpec(engine="sim", served_name="m", startup_timeout_s=100, source=source),
                               **kw)  # type: ignore[arg-type]


def rec(**kw: object) -> ReplicaRecord:
    base = ReplicaRecord(id="r1", model="m", fingerprint=spec("hf://o/r").fingerprint(), phase=Phase.STARTING,
                         api_key="k", node_id="n1", shard_id="r1-1", attempt=1, started_at=0.0, sent_at=0.0)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def node(*statuses: ShardStatus, weights: tuple[WeightFile, ...] = ()) -> NodeView:
    inv = Inventory(cpu_count=4, memory_total_bytes=8 << 30, memory_available_bytes=4 << 30, engines=(("sim", "1"),),
                    weights=weights)
    return NodeView("n1", inv, connected=True, shards={s.shard_id: s for s in statuses}, reported=True)


def fetching(shard_id: str = "r1-1", *, state: str = "fetching", message: str = "") -> ShardStatus:
    return ShardStatus(shard_id, "r1", ShardState.FETCHING, fetch=FetchProgress(
        done_bytes=410, total_bytes=1000, rate_bps=210e6, eta_s=3, state=state, message=message))


@pytest.mark.parametrize(("source", "fields"), [
    ("hf://o/r", {"hub_endpoint": "http://mirror:9000", "hub_token": TOKEN, "source_file": "q.gguf"}),
    ("mirror://llama/q.gguf", {"mirror_url": "http://mirror:9000", "source_sha256": SHA, "hub_token": ""}),
    ("https://host/q.gguf", {"source_sha256": SHA, "hub_token": "", "hub_endpoint": ""}),
    ("file:///srv/q.gguf", {"hub_token": "", "hub_endpoint": "", "mirror_url": "", "source_sha256": ""}),
])
def test_shard_spec_carries_remote_fields_and_the_token_only_for_hf(source: str, fields: dict[str, str]) -> None:
    """A StartShard carries what its source's fetch needs; the hub's token goes with an hf:// source alone."""
    s = spec(source, source_file="q.gguf" if source.startswith("hf") else "",
             source_sha256=SHA if source.startswith(("mirror", "https")) else "")
    out = decide.reconcile({"m": s}, [rec(phase=Phase.PENDING, node_id=None, shard_id=None, attempt=0,
                                          fingerprint=s.fingerprint())], {"n1": node()}, now=1000.0, cfg=CFG)
    started = [x for x in out if isinstance(x, d.StartShard)]
    assert len(started) == 1
    for key, want in fields.items():
        assert getattr(started[0].spec, key) == want, key
    assert TOKEN not in repr(started[0]) and TOKEN not in repr(CFG)


def test_fetching_shard_is_not_failed_for_the_startup_timeout() -> None:
    """A shard fetching for longer than startup_timeout is left alone; the timeout counts from Starting."""
    s = spec("hf://o/r")
    out = decide.reconcile({"m": s}, [rec()], {"n1": node(fetching())}, now=5000.0, cfg=CFG)
    assert not [x for x in out if isinstance(x, d.StopShard)]
    got = next(x.record for x in out if isinstance(x, d.UpdateReplica))
    assert got.failures == 0 and got.started_at == 5000.0 and got.message == "fetching its weights on node n1"
    starting = ShardStatus("r1-1", "r1", ShardState.STARTING)
    assert decide.reconcile({"m": s}, [got], {"n1": node(starting)}, now=5050.0, cfg=CFG) == [
        d.UpdateReplica(dataclasses.replace(got, message="starting on node n1"))]
    out = decide.reconcile({"m": s}, [got], {"n1": node(starting)}, now=5101.0, cfg=CFG)
    assert d.StopShard("n1", "r1-1", "did not become ready within 100s") in out


def test_fetching_rank_holds_the_groups_startup_timeout() -> None:
    """A group with a rank still fetching is not failed for the startup timeout."""
    s = spec("hf://o/r")
    members = (Member(0, "n1", "r1-1-0"), Member(1, "n1", "r1-1-1"))
    r = rec(shard_id="r1-1-0", members=members)
    out = decide.reconcile({"m": s}, [r], {"n1": node(fetching("r1-1-0"), fetching("r1-1-1"))}, now=5000.0,
                           cfg=CFG)
    assert not [x for x in out if isinstance(x, d.StopShard)]
    got = next(x.record for x in out if isinstance(x, d.UpdateReplica))
    assert got.started_at == 5000.0 and got.failures == 0


def test_stalled_fetch_is_a_fetch_stalled_condition() -> None:
    """WeightsPresent reads Fetching, FetchStalled (False, with the fetcher's reason), then Fetched once held."""
    s = spec("hf://o/r")

    def weights(n: NodeView) -> cond.Condition:
        return cond.replica_conditions(rec(), s, {"n1": n}, now=0.0, crash_loop_after=5)[1]

    assert (weights(node(fetching())).status, weights(node(fetching())).reason) == (cond.UNKNOWN, "Fetching")
    stalled = weights(node(fetching(state="stalled", message="no byte for 30 s from mirror:9000; retry 2")))
    assert (stalled.status, stalled.reason) == (cond.FALSE, "FetchStalled")
    assert "no byte for 30 s from mirror:9000" in stalled.message
    held = WeightFile(path="/w/hf-o-r-abc", size_bytes=10, format="safetensors", fetched_by_llmgw=True, source="hf://o/r",
                      cache_name="hf-o-r-abc")
    done = weights(node(ShardStatus("r1-1", "r1", ShardState.STARTING), weights=(held,)))
    assert (done.status, done.reason) == (cond.TRUE, "Fetched")
    assert weights(node(ShardStatus("r1-1", "r1", ShardState.STARTING))).reason == "NotFetched"


def test_get_replicas_phase_and_describe_bar_show_progress() -> None:
    """The REST document carries the node's live progress; the table shows `Fetching 41% 210 MB/s`, describe a bar."""
    doc = {"phase": "Starting", "fetch": fetch_of(rec(), {"n1": node(fetching())})}
    assert tables.phase_of(doc) == "Fetching 41% 210 MB/s"
    assert tables.fetch_bar(doc["fetch"], width=10) == "[####......] 41% 410 B of 1000 B, 210 MB/s, 3s left"
    assert fetch_of(rec(), {"n1": node(ShardStatus("r1-1", "r1", ShardState.STARTING))}) is None
    stalled = {"phase": "Starting", "fetch": fetch_of(rec(), {"n1": node(fetching(state="stalled"))})}
    assert tables.phase_of(stalled) == "Fetching 41% stalled"
    assert tables.phase_of({"phase": "Ready", "fetch": None}) == "Ready"
    # A Ready replica fetching a LoRA adapter its engine loads at runtime says so (agent: lorafiles.fetch_shown).
    ready = dataclasses.replace(fetching(), state=ShardState.READY)
    shown = {"phase": "Ready", "fetch": fetch_of(rec(), {"n1": node(ready)})}
    assert tables.phase_of(shown) == "Ready, fetching an adapter 41% 210 MB/s"
    assert fetch_of(rec(), {"n1": node(dataclasses.replace(ready, fetch=None))}) is None


def test_hub_token_from_file_or_environment_never_empty_file(tmp_path: Path) -> None:
    """The token comes from --hub-token-file, else LLMGW_HF_TOKEN; an empty file or a bad URL is refused."""
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    hub = serve.hub_settings(endpoint="https://huggingface.co/", mirror_url="", token_file=f,
                             env={"LLMGW_HF_TOKEN": "other"})
    assert (hub.endpoint, hub.token) == ("https://huggingface.co", TOKEN)
    assert serve.hub_settings(endpoint="https://huggingface.co", mirror_url="", token_file=None,
                              env={"LLMGW_HF_TOKEN": "from-env"}).token == "from-env"
    f.write_text("")
    with pytest.raises(LlmgwError, match="is empty"):
        serve.hub_settings(endpoint="https://huggingface.co", mirror_url="", token_file=f, env={})
    with pytest.raises(LlmgwError, match="--mirror-url"):
        serve.hub_settings(endpoint="https://huggingface.co", mirror_url="mirror:9000", token_file=None, env={})
