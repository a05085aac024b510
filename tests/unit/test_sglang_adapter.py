"""The SGLang adapter: every argv parses with SGLang 0.5.23's own flags; the key is in a 0600 file, not argv."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.engines import base, sglang
from llmgw.core import enginecheck, errors, inventory, shards
from llmgw.testing import argcheck

GIB = 1 << 30
PY = "/opt/sglang/bin/python"
FIXTURE = "sglang-0.5.23"
SPEC = shards.ShardSpec(shard_id="llama-1a2b3c-1", replica_id="llama-1a2b3c", model="llama", engine="sglang",
                        served_name="llama-8b", source="file:///models/llama", api_key="sk-shard-secret",
                        gpus=(0,), gpu_memory_bytes=60 * GIB)


def gpu(index: int) -> inventory.Gpu:
    return inventory.Gpu(index=index, uuid=f"GPU-{index}", name="H100", memory_total_bytes=80 * GIB,
                         memory_used_bytes=0, compute_capability="9.0")


def ib(name: str) -> inventory.Hca:
    return inventory.Hca(name=name, ports=(inventory.HcaPort(port=1, state="ACTIVE", link_layer="InfiniBand"),))


def roce(name: str, gid: int) -> inventory.Hca:
    return inventory.Hca(name=name, ports=(inventory.HcaPort(port=1, state="ACTIVE", link_layer="Ethernet",
                                                             roce_v2_gid_index=gid),))


NODE = enginecheck.NodeFacts(gpus=(gpu(0), gpu(1)), mgmt_interface="eth0", hcas=(roce("mlx5_0", 3),))


def launch(spec: shards.ShardSpec, work_dir: Path, *, node: enginecheck.NodeFacts = NODE) -> base.Launch:
    return sglang.Sglang(python=PY).launch(spec, host="10.0.0.5", port=30001, model_path="/models/llama",
                                           cpu_count=8, node=node, work_dir=str(work_dir))


def parsed(got: base.Launch) -> dict[str, Any]:
    """SGLang's own parser's reading of the argv (without ``python -m sglang.launch_server``)."""
    assert got.argv[1:3] == ["-m", "sglang.launch_server"]
    return argcheck.parse_with_fixture(FIXTURE, got.argv[3:])


def test_one_node_one_gpu(tmp_path: Path) -> None:
    """One GPU: SGLang reads the model, name, address, tp 1, memory fraction and metrics from the argv."""
    got = launch(SPEC, tmp_path)
    args = parsed(got)
    assert (args["model_path"], args["served_model_name"], args["host"], args["port"]) == (
        "/models/llama", "llama-8b", "10.0.0.5", 30001)
    assert (args["tp_size"], args["pp_size"], args["nnodes"], args["node_rank"]) == (1, 1, 1, 0)
    assert args["mem_fraction_static"] == 0.75 and args["enable_metrics"] is True
    assert args["device"] is None and args["dist_init_addr"] is None
    assert got.serves_http and got.env["HF_HUB_OFFLINE"] == "1" and got.env["TMPDIR"] == str(tmp_path)


def test_the_key_is_in_a_private_config_file_not_argv(tmp_path: Path) -> None:
    """The key is written 0600 to the work dir and passed by --config; it appears nowhere on argv or env."""
    got = launch(SPEC, tmp_path)
    assert not any("sk-shard-secret" in a for a in got.argv)
    assert not any("sk-shard-secret" in v for v in got.env.values())
    config = Path(parsed(got)["config"])
    assert config.parent == tmp_path and config.suffix == ".yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert config.read_text() == 'api-key: "sk-shard-secret"\n'


def test_the_config_file_holds_any_key_as_yaml_reads_it(tmp_path: Path) -> None:
    """A key with quotes, colons and a '#' is read back by a YAML parser unchanged."""
    import yaml
    key = 'a: "b" #c\\d'
    got = launch(dataclasses.replace(SPEC, api_key=key), tmp_path)
    assert yaml.safe_load(Path(parsed(got)["config"]).read_text()) == {"api-key": key}


def test_no_key_no_config_and_no_work_dir_with_a_key_is_refused(tmp_path: Path) -> None:
    """Without a key there is no config file; with a key and no work dir the launch is refused, not put on argv."""
    got = launch(dataclasses.replace(SPEC, api_key=""), tmp_path)
    assert "--config" not in got.argv and list(tmp_path.iterdir()) == []
    with pytest.raises(errors.EngineError, match="no private work dir"):
        sglang.Sglang(python=PY).launch(SPEC, host="h", port=1, model_path="/m", cpu_count=1, node=NODE)


def test_two_gpus_tensor_parallel(tmp_path: Path) -> None:
    """tp 2 over two GPUs is --tp-size 2 (0.5.23 has no --tp)."""
    args = parsed(launch(dataclasses.replace(SPEC, gpus=(0, 1), tensor_parallel=2), tmp_path))
    assert args["tp_size"] == 2


def test_two_nodes_rank_0_and_rank_1(tmp_path: Path) -> None:
    """Over two nodes both ranks take the whole tp, their rank and the leader's address; rank 1 serves none."""
    spec = dataclasses.replace(SPEC, gpus=(0, 1), nnodes=2, tensor_parallel=4, leader_addr="10.0.0.5",
                               leader_port=29555, hcas=("mlx5_0",))
    lead = launch(spec, tmp_path)
    args = parsed(lead)
    assert (args["tp_size"], args["nnodes"], args["node_rank"], args["dist_init_addr"]) == (
        4, 2, 0, "10.0.0.5:29555")
    assert lead.serves_http and args["config"]
    assert {k: v for k, v in lead.env.items() if k.startswith(("NCCL_", "GLOO_"))} == {
        "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "3"}
    work = tmp_path / "rank1"
    work.mkdir()
    worker = launch(dataclasses.replace(spec, rank=1), work)
    wargs = parsed(worker)
    assert (wargs["node_rank"], wargs["config"]) == (1, None)  # a rank that serves no API gets no key
    assert not worker.serves_http and list(work.iterdir()) == []


@pytest.mark.parametrize(("dtype", "dest", "expected"), [("fp8", "quantization", "fp8"),
                                                        ("bfloat16", "dtype", "bfloat16"),
                                                        ("float32", "dtype", "float32"), ("", "dtype", "auto")])
def test_dtype(tmp_path: Path, dtype: str, dest: str, expected: str) -> None:
    """fp8 is SGLang's fp8 quantization, other dtypes its --dtype (one of its choices); none leaves auto."""
    assert parsed(launch(dataclasses.replace(SPEC, dtype=dtype), tmp_path))[dest] == expected


def test_context_length(tmp_path: Path) -> None:
    """context_length becomes --context-length; unset, SGLang takes the model's own."""
    assert parsed(launch(dataclasses.replace(SPEC, context_length=32768), tmp_path))["context_length"] == 32768
    assert parsed(launch(SPEC, tmp_path))["context_length"] is None


def test_cpu_replica_asks_for_the_cpu_device(tmp_path: Path) -> None:
    """Without GPUs: --device cpu and no memory fraction."""
    args = parsed(launch(dataclasses.replace(SPEC, gpus=(), gpu_memory_bytes=0), tmp_path))
    assert args["device"] == "cpu" and args["mem_fraction_static"] is None


def test_an_abbreviation_that_sglang_takes_is_refused_like_the_flag(tmp_path: Path) -> None:
    """SGLang's parser reads --tp as --tp-size, so engine args with --tp are refused; the parse shows why."""
    record = argcheck.load_fixture(FIXTURE)
    assert record["allow_abbrev"] is True
    with pytest.raises(errors.EngineError, match="--tp "):
        launch(dataclasses.replace(SPEC, args=("--tp", "8")), tmp_path)


def test_engine_args_pass_through_and_still_parse(tmp_path: Path) -> None:
    """The model's own SGLang flags come last and parse with SGLang's parser."""
    got = launch(dataclasses.replace(SPEC, args=("--chunked-prefill-size", "4096", "--trust-remote-code")), tmp_path)
    args = parsed(got)
    assert args["chunked_prefill_size"] == 4096 and args["trust_remote_code"] is True


@pytest.mark.parametrize("arg", ["--tp-size", "--tensor-parallel-size", "--model", "--api-key", "--config",
                                 "--dist-init-addr=x", "--mem-fraction-static", "--tp", "--mem-frac"])
def test_reserved_flags_are_refused(tmp_path: Path, arg: str) -> None:
    """Flags the adapter sets, in each of SGLang's spellings and abbreviations, are refused before launch."""
    with pytest.raises(errors.EngineError, match="set flags llmgw sets itself for sglang"):
        launch(dataclasses.replace(SPEC, args=(arg, "1")), tmp_path)


def test_in_flight_and_probe() -> None:
    """The drain reads sglang:num_running_reqs + sglang:num_queue_reqs; the probe asks importlib.metadata for sglang."""
    body = b'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0\nsglang:num_queue_reqs{model_name="m"} 2.0\n'
    path, parse = sglang.Sglang().in_flight_probe()
    assert path == "/metrics" and parse(body) == 5
    asked: list[list[str]] = []
    adapter = sglang.Sglang(python=PY, run=lambda argv: asked.append(argv) or "0.5.23\n")
    assert adapter.probe() == "0.5.23"
    assert asked[0][:2] == [PY, "-c"] and "('sglang',)" in asked[0][2] and "import sglang" not in asked[0][2]
