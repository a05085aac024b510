"""Every argv the vLLM adapter builds is read by vLLM 0.32's own parser as the adapter means it.

The parser is vLLM's real one, run in ``.venv-vllm``: ``FlexibleArgumentParser`` +
``make_arg_parser`` (what both ``python -m vllm.entrypoints.openai.api_server`` and
``vllm serve`` build), then ``validate_parsed_serve_args`` and ``AsyncEngineArgs.from_cli_args``
(which maps the namespace onto the engine's own fields). Building it takes ~13 s, so every
argv is parsed in one subprocess, which prints each parse's dests as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from typing import Any

import pytest

from llmgw.agent.engines import base, vllm
from llmgw.core import enginecheck, inventory, shards

pytestmark = pytest.mark.engines

GIB = 1 << 30
SPEC = shards.ShardSpec(shard_id="llama-1a2b3c-1", replica_id="llama-1a2b3c", model="llama", engine="vllm",
                        served_name="llama-8b", source="file:///models/llama", api_key="sk-shard-secret",
                        memory_bytes=8 * GIB)
NODE = enginecheck.NodeFacts(
    gpus=tuple(inventory.Gpu(index=i, uuid=f"GPU-{i}", name="H100", memory_total_bytes=80 * GIB, memory_used_bytes=0,
                             compute_capability="9.0") for i in range(2)),
    mgmt_interface="eth0")
TWO_NODES = dataclasses.replace(SPEC, gpus=(0, 1), nnodes=2, tensor_parallel=2, pipeline_parallel=2,
                                leader_addr="10.0.0.5", leader_port=29555, gpu_memory_bytes=60 * GIB)

#: Profile name -> the shard it launches.
PROFILES: dict[str, shards.ShardSpec] = {
    "cpu": SPEC,
    "cpu-context-and-args": dataclasses.replace(SPEC, context_length=512, args=("--max-num-seqs", "8", "--seed", "1")),
    "gpu-tp2": dataclasses.replace(SPEC, gpus=(0, 1), tensor_parallel=2, gpu_memory_bytes=40 * GIB),
    "gpu-fp8": dataclasses.replace(SPEC, gpus=(0,), dtype="fp8", gpu_memory_bytes=70 * GIB),
    "gpu-bf16-compiled": dataclasses.replace(SPEC, gpus=(0,), dtype="bfloat16", args=("-O3",)),
    "two-nodes-rank0": TWO_NODES,
    "two-nodes-rank1": dataclasses.replace(TWO_NODES, rank=1),
}

#: The engine key and certificate engine_tls copies into the work dir.
TLS = base.TlsFiles(key="/run/llmgw/x.d/engine.key", cert="/run/llmgw/x.d/engine.crt")

#: Run in vLLM's python: parse each argv of the JSON list on stdin, print the dests of each.
SCRIPT = r"""
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
out = []
for argv in json.load(sys.stdin):
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    if args.model_tag is not None:  # as `vllm serve` does (entrypoints/cli/serve.py, ServeSubcommand.cmd)
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    out.append({"args": vars(args), "engine_model": engine.model})
print("PARSED " + json.dumps(out, default=str))
"""


def module_and_args(launch: base.Launch) -> tuple[str, list[str]]:
    """(module, argv for its parser): ``python -m M ...``, with ``serve`` taken off as vLLM's CLI does."""
    assert launch.argv[1] == "-m"
    module, rest = launch.argv[2], launch.argv[3:]
    if module == vllm.CLI_MODULE:
        assert rest[0] == "serve"
        rest = rest[1:]
    return module, rest


@pytest.fixture(scope="module")
def parsed(vllm_python: str) -> dict[str, dict[str, Any]]:
    """Each profile's launch and vLLM's reading of its argv, from one run of vLLM's parser."""
    launches = {name: vllm.Vllm(python=vllm_python).launch(spec, host="127.0.0.1", port=8011,
                                                           model_path="/models/llama", cpu_count=2, node=NODE,
                                                           work_dir="/run/llmgw/x.d")
                for name, spec in PROFILES.items()}
    launches["cpu-tls"] = vllm.Vllm(python=vllm_python).launch(
        SPEC, host="10.0.0.5", port=8011, model_path="/models/llama", cpu_count=2, node=NODE,
        work_dir="/run/llmgw/x.d", tls=TLS)
    argvs = [module_and_args(launch)[1] for launch in launches.values()]
    done = subprocess.run([vllm_python, "-c", SCRIPT], input=json.dumps(argvs), capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PARSED ")]
    assert done.returncode == 0 and lines, f"vLLM's parser refused an argv:\n{done.stderr[-4000:]}"
    results = json.loads(lines[-1].removeprefix("PARSED "))
    return {name: {"launch": launch, **result} for (name, launch), result in zip(launches.items(), results,
                                                                                    strict=True)}


def test_cpu_replica(parsed: dict[str, dict[str, Any]]) -> None:
    """The CPU argv: model, name, address, tp/pp 1, eager; no key on argv (vLLM sees none, it reads VLLM_API_KEY)."""
    args = parsed["cpu"]["args"]
    assert (args["model"], args["served_model_name"], args["host"], args["port"]) == (
        "/models/llama", ["llama-8b"], "127.0.0.1", 8011)
    assert parsed["cpu"]["engine_model"] == "/models/llama"
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"], args["enforce_eager"]) == (1, 1, True)
    assert args["api_key"] is None and args["headless"] is False
    assert args["gpu_memory_utilization"] == 0.92  # vLLM's own default: a CPU replica's memory is the KV env var


def test_context_and_the_models_own_args(parsed: dict[str, dict[str, Any]]) -> None:
    """context_length is vLLM's max_model_len; engine args after it are vLLM's too."""
    args = parsed["cpu-context-and-args"]["args"]
    assert (args["max_model_len"], args["max_num_seqs"], args["seed"]) == (512, 8, 1)


def test_tensor_parallel_and_memory(parsed: dict[str, dict[str, Any]]) -> None:
    """tp 2 on two GPUs with 40 of 80 GiB given: tensor_parallel_size 2, gpu_memory_utilization 0.5, not eager."""
    args = parsed["gpu-tp2"]["args"]
    assert (args["tensor_parallel_size"], args["gpu_memory_utilization"], args["enforce_eager"]) == (2, 0.5, False)


def test_dtypes(parsed: dict[str, dict[str, Any]]) -> None:
    """fp8 is vLLM's fp8 quantization with dtype auto; bfloat16 is its dtype, and -O3 is left to compile."""
    fp8 = parsed["gpu-fp8"]["args"]
    assert (fp8["quantization"], fp8["dtype"], fp8["gpu_memory_utilization"]) == ("fp8", "auto", 0.88)
    bf16 = parsed["gpu-bf16-compiled"]["args"]
    assert (bf16["dtype"], bf16["quantization"], bf16["enforce_eager"]) == ("bfloat16", None, False)


def test_two_nodes(parsed: dict[str, dict[str, Any]]) -> None:
    """Both ranks: nnodes 2, their node rank, the leader's address and port; rank 1 headless under `serve`."""
    lead, worker = parsed["two-nodes-rank0"], parsed["two-nodes-rank1"]
    for rank, run in enumerate((lead, worker)):
        args = run["args"]
        assert (args["nnodes"], args["node_rank"], args["master_addr"], args["master_port"]) == (
            2, rank, "10.0.0.5", 29555)
        assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (2, 2)
        assert run["engine_model"] == "/models/llama"
    assert module_and_args(lead["launch"])[0] == vllm.MODULE and lead["args"]["headless"] is False
    assert module_and_args(worker["launch"])[0] == vllm.CLI_MODULE
    assert worker["args"]["headless"] is True and worker["args"]["model_tag"] == "/models/llama"
    assert not worker["launch"].serves_http


def test_tls(parsed: dict[str, dict[str, Any]]) -> None:
    """engine_tls: vLLM reads the node's engine key and certificate from its work dir; no CA, no client auth."""
    args = parsed["cpu-tls"]["args"]
    assert (args["ssl_keyfile"], args["ssl_certfile"]) == (TLS.key, TLS.cert)
    assert args["ssl_ca_certs"] is None and args["host"] == "10.0.0.5"
    assert parsed["cpu"]["args"]["ssl_keyfile"] is None
