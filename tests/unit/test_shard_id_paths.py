"""Every place the agent turns a shard id into a path refuses one that is not a shard id, before any file is made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.agent import engines
from llmgw.agent.supervisor import launching, statefiles
from llmgw.core.errors import EngineError, ShardIdError
from llmgw.core.shards import ShardSpec

# "ABS" stands for an absolute path inside the test's own directory, so a regression writes nowhere else.
BAD = ["../evil", "ABS", "..", "a/../../b", "", "a\0b", "-rf", "x" * 200]


def _spec(shard_id: str) -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r", model="m", engine="sim", served_name="m")


def _saved(shard_id: str, run_dir: Path) -> statefiles.Saved:
    return statefiles.Saved(spec=_spec(shard_id), pid=4242, create_time=1.0, port=1, endpoint="http://127.0.0.1:1",
                            host="127.0.0.1", log_path=run_dir / "x.log")


@pytest.mark.parametrize("bad", BAD, ids=lambda b: repr(b[:20]))
def test_launch_log_and_state_file_paths_refuse_a_bad_id(tmp_path: Path, bad: str) -> None:
    """The launch plan (its log), the log path, the state file's path and its write all refuse; nothing is written."""
    run_dir = tmp_path / "state" / "shards"
    bad = str(tmp_path / "outside" / "evil") if bad == "ABS" else bad
    with pytest.raises(EngineError, match="is not valid"):
        launching.plan(_spec(bad), engines.get("sim"), host="127.0.0.1", model_path=None, cpu_count=1,
                       run_dir=run_dir)
    with pytest.raises(ShardIdError):
        launching.log_path_of(run_dir, bad)
    with pytest.raises(ShardIdError):
        statefiles.path_of(run_dir, bad)
    with pytest.raises(ShardIdError):
        statefiles.write(run_dir, _saved(bad, run_dir))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_state_file_naming_a_bad_id_is_unreadable(tmp_path: Path) -> None:
    """A state file put there by hand whose spec names a bad id is Unreadable (so never adopted), saying why."""
    run_dir = tmp_path / "shards"
    good = statefiles.write(run_dir, _saved("m-abc123-1", run_dir))
    doc = json.loads(good.read_text())
    doc["spec"]["shard_id"] = doc["shard_id"] = "../../evil"
    crafted = run_dir / "crafted.json"
    crafted.write_text(json.dumps(doc))
    with pytest.raises(statefiles.Unreadable, match=r"crafted.json: shard id '../../evil' is not valid"):
        statefiles.read(crafted)
    assert statefiles.read(good).shard_id == "m-abc123-1"
    assert launching.log_path_of(run_dir, "m-abc123-1") == run_dir / "m-abc123-1.log"
