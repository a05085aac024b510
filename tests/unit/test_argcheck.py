"""argcheck: argv parsed with an engine's own flags, rebuilt from the fixture its real parser wrote."""

from __future__ import annotations

import pytest

from llmgw.testing import argcheck

SGLANG = "sglang-0.5.23"
VLLM = "vllm-0.32.0"

# docs.sglang.io, references/multi_node_deployment/multi_node: "Run 405B (fp16) on Two Nodes", node 0, with the
# host and port of the two-node example in SGLang's deployment guide. The docs write `--tp 16`; 0.5.23 has no
# `--tp` flag and takes it only as argparse's abbreviation of `--tp-size` (see the abbreviation test below).
DOCS_NODE0 = [
    "--model-path", "meta-llama/Meta-Llama-3.1-405B-Instruct",
    "--tp-size", "16",
    "--dist-init-addr", "172.16.4.52:20000",
    "--nnodes", "2",
    "--node-rank", "0",
    "--host", "0.0.0.0",
    "--port", "30000",
]  # fmt: skip


def _refusal(fixture: str, argv: list[str], **kwargs: bool) -> argcheck.ArgvRefused:
    with pytest.raises(argcheck.ArgvRefused) as caught:
        argcheck.parse_with_fixture(fixture, argv, **kwargs)
    return caught.value


def test_fixture_was_written_by_sglangs_own_parser() -> None:
    """The SGLang fixture names the engine, version 0.5.23 and the real parser call that produced it."""
    record = argcheck.load_fixture(SGLANG)
    assert (record["engine"], record["version"]) == ("sglang", "0.5.23")
    assert "ServerArgs.add_cli_args" in record["parser"]
    assert len(record["actions"]) > 400


def test_sglang_docs_multinode_argv_parses_to_engine_dests() -> None:
    """SGLang's documented two-node launch parses to the dests ServerArgs reads, defaults filled in."""
    parsed = argcheck.parse_with_fixture(SGLANG, DOCS_NODE0)
    assert parsed["model_path"] == "meta-llama/Meta-Llama-3.1-405B-Instruct"
    assert (parsed["tp_size"], parsed["nnodes"], parsed["node_rank"]) == (16, 2, 0)
    assert parsed["dist_init_addr"] == "172.16.4.52:20000"
    assert (parsed["host"], parsed["port"]) == ("0.0.0.0", 30000)
    assert parsed["pp_size"] == 1 and parsed["dtype"] == "auto" and parsed["api_key"] is None


def test_sglang_value_types_are_the_engines() -> None:
    """Floats, SGLang's SI/IEC integers, a JSON flag and a --no- boolean convert as the engine converts them."""
    parsed = argcheck.parse_with_fixture(SGLANG, [
        "--model-path", "m", "--mem-fraction-static", "0.8", "--context-length", "32k",
        "--served-model-name", "llama", "--dtype", "bfloat16", "--extra-metric-labels", '{"a": "1"}',
        "--no-enable-tp-lm-head-all-to-all",
    ])  # fmt: skip
    assert parsed["mem_fraction_static"] == 0.8 and parsed["context_length"] == 32000
    assert parsed["served_model_name"] == "llama" and parsed["dtype"] == "bfloat16"
    assert parsed["extra_metric_labels"] == {"a": "1"}
    assert parsed["enable_tp_lm_head_all_to_all"] is False
    iec = argcheck.parse_with_fixture(SGLANG, ["--model-path", "m", "--context-length", "4Ki"])
    assert iec["context_length"] == 4096
    assert "1K" in _refusal(SGLANG, ["--model-path", "m", "--context-length", "1K"]).problem


def test_unknown_flag_is_refused_by_name() -> None:
    """A flag SGLang 0.5.23 does not have is refused, and the refusal names it and the engine version."""
    exc = _refusal(SGLANG, [*DOCS_NODE0, "--max-model-len", "4096"])
    assert "--max-model-len" in str(exc) and "sglang 0.5.23" in str(exc)


def test_abbreviation_is_refused() -> None:
    """`--tp` (accepted by the engine only as a prefix of --tp-size) is refused: adapters write full flags."""
    exc = _refusal(SGLANG, ["--model-path", "m", "--tp", "16"])
    assert "--tp" in exc.problem


def test_bad_int_is_refused() -> None:
    """A non-integer given to an integer flag is refused, naming the flag and the value."""
    exc = _refusal(SGLANG, ["--model-path", "m", "--tp-size", "two"])
    assert "--tp-size" in exc.problem and "two" in exc.problem


def test_bad_choice_is_refused() -> None:
    """A value outside a flag's choices is refused, naming the flag."""
    exc = _refusal(SGLANG, ["--model-path", "m", "--dtype", "fp8"])
    assert "--dtype" in exc.problem and "invalid choice" in exc.problem


def test_missing_value_and_missing_required_are_refused() -> None:
    """A flag at the end with no value, and an argv without the required --model-path, are both refused."""
    assert "--port" in _refusal(SGLANG, ["--model-path", "m", "--port"]).problem
    assert "--model-path" in _refusal(SGLANG, ["--port", "30000"]).problem


def test_deprecated_flag_is_refused_unless_allowed() -> None:
    """A flag SGLang marks deprecated is refused by default and parses when allow_deprecated is set."""
    argv = ["--model-path", "m", "--disable-cuda-graph"]
    assert "deprecated" in _refusal(SGLANG, argv).problem
    assert argcheck.parse_with_fixture(SGLANG, argv, allow_deprecated=True)["disable_cuda_graph"] is True


def test_vllm_fixture_parses_serve_argv() -> None:
    """vLLM 0.32's recorded serve flags take the multi-node argv and refuse SGLang's spelling of them."""
    parsed = argcheck.parse_with_fixture(VLLM, [
        "--model", "/models/m", "--served-model-name", "m", "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
        "--headless", "--max-model-len", "4k", "--gpu-memory-utilization", "0.5",
    ])  # fmt: skip
    assert parsed["served_model_name"] == ["m"] and parsed["max_model_len"] == 4000
    assert (parsed["tensor_parallel_size"], parsed["pipeline_parallel_size"], parsed["node_rank"]) == (2, 2, 1)
    assert parsed["headless"] is True and parsed["master_addr"] == "10.0.0.1"
    assert "--tp-size" in _refusal(VLLM, ["--model", "m", "--tp-size", "2"]).problem
    # vLLM's optional_type(int): "None" is None, anything else must still be an integer.
    unset = argcheck.parse_with_fixture(VLLM, ["--distributed-timeout-seconds", "None"])
    assert unset["distributed_timeout_seconds"] is None
    assert "--distributed-timeout-seconds" in _refusal(VLLM, ["--distributed-timeout-seconds", "ten"]).problem


def test_unknown_fixture_lists_the_ones_there_are() -> None:
    """Asking for a fixture that is not shipped names the ones that are and how to make one."""
    with pytest.raises(FileNotFoundError, match="sglang-0.5.23.*engine_flags.py"):
        argcheck.load_fixture("sglang-9.9")
