"""The supervisor's pure parts: recovery decisions, state files, and the engines' in-flight parsers.

No process is spawned and no socket opened: survey results are plain ``Seen``
values, and the llama.cpp body is one captured from the real server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from llmgw.agent import engines
from llmgw.agent.engines import llamacpp, sim
from llmgw.agent.supervisor import launching, orphans, recovering, statefiles
from llmgw.core.shards import ShardSpec

RUN = "/var/lib/llmgw/shards"

# GET /metrics of xllamacpp 2026.10 (tiny model, --parallel 1) with one stream
# generating and two queued behind it; /slots showed only the one busy slot then.
LLAMACPP_METRICS_BUSY = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 160
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 0.001456
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 300
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 0.074176
# HELP llamacpp:n_decode_total Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 300
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 459
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 0
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 0
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 0
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 0
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 4030.95
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1
"""  # noqa: E501 (the server's own HELP line)


def spec(shard_id: str = "a") -> ShardSpec:
    return ShardSpec(shard_id=shard_id, replica_id="r", model="m", engine="sim", served_name="m", api_key="sekrit",
                     args=("--decode-tps", "50"), env=(("X", "1"),))


def saved(shard_id: str = "a", *, pid: int = 4242, create_time: float = 1000.0) -> statefiles.Saved:
    return statefiles.Saved(spec=spec(shard_id), pid=pid, create_time=create_time, port=8001,
                            endpoint="http://127.0.0.1:8001", host="127.0.0.1", log_path=Path(f"{RUN}/{shard_id}.log"),
                            log_offset=12, argv=("python", "-m", "llmgw.sim.engine"))


def seen(pid: int, *, shard_id: str | None = "a", run_dir: str | None = RUN, create_time: float = 1000.0,
         environ_read: bool = True, pgid: int | None = None) -> orphans.Seen:
    return orphans.Seen(pid=pid, create_time=create_time, pgid=pgid or pid, shard_id=shard_id, run_dir=run_dir,
                        environ_read=environ_read)


def path(shard_id: str) -> Path:
    return Path(f"{RUN}/{shard_id}.json")


def test_the_engine_with_its_marker_is_adopted() -> None:
    """Same pid, marker naming the shard and the run dir: adopted, nothing forgotten or killed."""
    found = orphans.Survey(by_pid={4242: seen(4242)}, marked=[seen(4242)])
    assert recovering.decide([(path("a"), saved())], found, run_dir=RUN) == [recovering.Adopt(saved(), seen(4242))]


def test_a_marker_outweighs_a_start_time_moved_by_the_clock() -> None:
    """A stepped clock moves create_time; the environment still names the shard, so it is adopted, with a note."""
    moved = seen(4242, create_time=1000.0 + 3600)
    [decision] = recovering.decide([(path("a"), saved())], orphans.Survey({4242: moved}, [moved]), run_dir=RUN)
    assert isinstance(decision, recovering.Adopt) and "system clock was stepped" in decision.note


def test_without_a_readable_environment_the_start_time_decides() -> None:
    """Environment unreadable: within the slack it is the engine; an hour off, the pid was reused."""
    near = seen(4242, shard_id=None, run_dir=None, environ_read=False, create_time=1000.4)
    far = dataclasses.replace(near, create_time=4600.0)
    assert isinstance(recovering.decide([(path("a"), saved())], orphans.Survey({4242: near}, []), run_dir=RUN)[0],
                      recovering.Adopt)
    [forget] = recovering.decide([(path("a"), saved())], orphans.Survey({4242: far}, []), run_dir=RUN)
    assert isinstance(forget, recovering.Forget) and "reused" in forget.reason


def test_a_dead_or_reused_pid_is_forgotten_and_never_killed() -> None:
    """Gone, or now a process without the marker: the file goes, and no Kill names that pid."""
    stranger = seen(4343, shard_id=None, run_dir=None)
    files = [(path("a"), saved("a", pid=4242)), (path("b"), saved("b", pid=4343))]
    decisions = recovering.decide(files, orphans.Survey({4242: None, 4343: stranger}, []), run_dir=RUN)
    assert [type(d) for d in decisions] == [recovering.Forget, recovering.Forget]
    assert "no longer running" in decisions[0].reason and "reused" in decisions[1].reason


def test_an_engine_of_another_run_dir_is_not_ours() -> None:
    """Same shard id under another agent's run dir: the pid is not this file's engine."""
    other = seen(4242, run_dir="/elsewhere")
    [decision] = recovering.decide([(path("a"), saved())], orphans.Survey({4242: other}, []), run_dir=RUN)
    assert isinstance(decision, recovering.Forget)


def test_marked_processes_nothing_describes_are_killed() -> None:
    """No state file, an unreadable one, a dead leader's worker, no shard id: each killed, with its reason."""
    files: recovering.Files = [(path("u"), statefiles.Unreadable("u.json is not JSON")),
                               (path("d"), saved("d", pid=5000))]
    marked = [seen(6001, shard_id="nofile"), seen(6002, shard_id="u"), seen(6003, shard_id="d", pgid=5000),
              seen(6004, shard_id=None)]
    decisions = recovering.decide(files, orphans.Survey({5000: None}, marked), run_dir=RUN)
    kills = {d.seen.pid: d.reason for d in decisions if isinstance(d, recovering.Kill)}
    assert kills.keys() == {6001, 6002, 6003, 6004}
    assert "has no state file" in kills[6001]
    assert "unreadable" in kills[6002]
    assert "no longer running" in kills[6003]
    assert launching.SHARD_ENV in kills[6004]


def test_an_adopted_engines_workers_and_our_own_processes_are_spared() -> None:
    """A worker carrying an adopted shard's marker is part of it; kept pids and known shards are left alone."""
    worker = seen(4250, pgid=4242)
    marked = [seen(4242), worker, seen(7000, shard_id="mine"), seen(7001, shard_id="x")]
    found = orphans.Survey({4242: seen(4242)}, marked)
    decisions = recovering.decide([(path("a"), saved()), (path("x"), saved("x", pid=7001))], found, run_dir=RUN,
                                  keep={7000}, known={"x"})
    assert [type(d) for d in decisions] == [recovering.Adopt]


def test_state_file_round_trip_is_private_and_atomic(tmp_path: Path) -> None:
    """What is written reads back equal; the file is 0600 (it holds the API key) and no temporary is left."""
    written = statefiles.write(tmp_path, saved())
    assert written == tmp_path / "a.json"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert statefiles.read(written) == saved()
    raw = json.loads(written.read_text())
    assert (raw["version"], raw["pid"], raw["create_time"], raw["port"]) == (1, 4242, 1000.0, 8001)
    assert raw["spec"]["api_key"] == "sekrit" and raw["endpoint"] == "http://127.0.0.1:8001"
    statefiles.write(tmp_path, dataclasses.replace(saved(), pid=4343))
    assert statefiles.read(written).pid == 4343
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


@pytest.mark.parametrize(("content", "why"), [
    (b"{not json", "not JSON"),
    (b'{"version": 99}', "version 99"),
    (b'{"version": 1, "spec": {}}', "does not describe a shard"),
])
def test_unreadable_state_files_say_why(tmp_path: Path, content: bytes, why: str) -> None:
    """Garbage, another version and missing fields are Unreadable naming the problem."""
    (tmp_path / "a.json").write_bytes(content)
    with pytest.raises(statefiles.Unreadable, match=why):
        statefiles.read(tmp_path / "a.json")


def test_a_state_file_must_match_its_name_and_newer_fields_are_dropped(tmp_path: Path) -> None:
    """A file renamed to another shard is refused; a spec field from a newer agent is ignored."""
    raw = json.loads(statefiles.write(tmp_path, saved()).read_text())
    (tmp_path / "b.json").write_text(json.dumps(raw))
    with pytest.raises(statefiles.Unreadable, match="not the one its name says"):
        statefiles.read(tmp_path / "b.json")
    raw["spec"]["pipeline_rank"] = 1
    (tmp_path / "a.json").write_text(json.dumps(raw))
    assert statefiles.read(tmp_path / "a.json") == saved()


def test_a_state_file_keeps_the_gpus_and_an_older_one_means_none(tmp_path: Path) -> None:
    """The spec's GPU indices read back in order (adoption keeps them); a file without the field gave none."""
    given = dataclasses.replace(saved(), spec=dataclasses.replace(spec("a"), gpus=(3, 1)))
    written = statefiles.write(tmp_path, given)
    assert json.loads(written.read_text())["spec"]["gpus"] == [3, 1]
    assert statefiles.read(written).spec.gpus == (3, 1)
    assert statefiles.read(written) == given
    raw = json.loads(written.read_text())
    del raw["spec"]["gpus"]  # as an agent before the field wrote it
    written.write_text(json.dumps(raw))
    assert statefiles.read(written).spec.gpus == ()


def test_listing_skips_logs_and_clears_interrupted_writes(tmp_path: Path) -> None:
    """Only *.json are state files; a temporary left by a killed agent is removed."""
    (tmp_path / "a.log").write_text("x")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / ".b.json.77.tmp").write_text("{")
    assert statefiles.listing(tmp_path) == [tmp_path / "a.json"]
    assert not (tmp_path / ".b.json.77.tmp").exists()
    assert statefiles.listing(tmp_path / "missing") == []


def test_llamacpp_counts_processing_and_deferred_from_real_metrics() -> None:
    """Measured body: 1 processing + 2 deferred is 3 in flight; without both gauges the count is unknown."""
    path_, parse = engines.get("llamacpp").in_flight_probe()
    assert path_ == "/metrics" and parse is llamacpp.parse_metrics_in_flight
    assert parse(LLAMACPP_METRICS_BUSY.encode()) == 3
    idle = LLAMACPP_METRICS_BUSY.replace("requests_processing 1", "requests_processing 0").replace(
        "requests_deferred 2", "requests_deferred 0")
    assert parse(idle.encode()) == 0
    without = "\n".join(ln for ln in LLAMACPP_METRICS_BUSY.splitlines() if "deferred" not in ln)
    assert parse(without.encode()) is None
    assert parse(b"") is None and parse(b"llamacpp:requests_processing x\nllamacpp:requests_deferred 0") is None


def test_sim_counts_running_and_waiting() -> None:
    """/sim/stats running + waiting; anything else is unknown, never 0."""
    path_, parse = engines.get("sim").in_flight_probe()
    assert path_ == "/sim/stats" and parse is sim.parse_sim_stats
    assert parse(b'{"running":2,"waiting":3,"completed":9,"aborted":0}') == 5
    assert parse(b'{"running":0,"waiting":0}') == 0
    for bad in (b"", b"[]", b'{"running":1}', b'{"running":true,"waiting":0}', b"\xff"):
        assert parse(bad) is None


def test_engines_carry_the_marker_a_spec_cannot_override(tmp_path: Path) -> None:
    """LLMGW_SHARD_ID and LLMGW_RUN_DIR are set last, over the spec's own env."""
    s = dataclasses.replace(spec(), env=((launching.RUN_DIR_ENV, "/hidden"), ("X", "1")), port=8123)
    p = launching.plan(s, engines.get("sim"), host="127.0.0.1", model_path=None, cpu_count=2, run_dir=tmp_path)
    assert p.env[launching.SHARD_ENV] == "a" and p.env[launching.RUN_DIR_ENV] == str(tmp_path)
    assert p.env["X"] == "1" and p.port == 8123 and os.path.isabs(p.env[launching.RUN_DIR_ENV])
