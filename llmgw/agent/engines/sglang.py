"""The SGLang adapter: ``python -m sglang.launch_server`` with the python that has SGLang.

Every flag is SGLang 0.5.23's as its own parser has it
(``ServerArgs.add_cli_args``, recorded in ``llmgw/testing/engineflags/sglang-0.5.23.json``
by ``scripts/engine_flags.py``); ``tests/unit/test_sglang_adapter.py`` parses each
argv built here against that record. Tensor parallelism is ``--tp-size``: 0.5.23
has no ``--tp`` (its parser would take it only as an abbreviation).

Multi-node is SGLang's own: every rank gets ``--nnodes N --node-rank R
--dist-init-addr LEADER:PORT`` and the whole replica's ``--tp-size`` /
``--pp-size``; rank 0 serves HTTP and the ranks above it run their schedulers
only (no HTTP: judged by staying alive).

The API key: SGLang reads it from no environment variable, only ``--api-key``,
and a command line is readable by every user of the node. So the key goes in a
YAML file under the shard's private work dir (mode 0600) passed as
``--config``: ``launch_server`` parses its argv with ``prepare_server_args``,
which merges the file's ``key: value`` pairs ahead of the command line
(``server_args_config_parser.ConfigArgumentMerger``; the file must end .yaml). Only rank 0
gets it: the others serve no API. Writing that file is the one thing this
adapter writes; without a work dir a shard with a key is refused rather than
put on argv.

``--mem-fraction-static`` is ``gpu_memory_bytes`` over the smallest given
GPU's total (as vLLM's ``--gpu-memory-utilization``); SGLang's fraction covers
weights and KV cache, so activations come on top of what placement counted,
which its estimate's 10 % overhead is there for. Unset when either is unknown.

``--enable-metrics`` is always on: the router's load gauges and the drain's
in-flight probe (``sglang:num_running_reqs`` + ``sglang:num_queue_reqs``) read
``/metrics``, which SGLang serves only with it.

SGLang cannot serve on a CPU without AVX-512 or AMX (its CPU kernels need
them and are built from source): ``enginecheck`` refuses a CPU replica on such
a node by the record's ``cpu_flags_any``; elsewhere a CPU replica gets
``--device cpu``.

Version: ``importlib.metadata.version("sglang")`` asked in the configured python
by a one-line subprocess, never ``import sglang`` (which takes seconds and
initialises CUDA), kept until the python or its ``bin`` directory changes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from llmgw.agent.engines import base
from llmgw.core import adapters, enginecheck, engines, errors, inventory, shards

MODULE = "sglang.launch_server"
DISTRIBUTIONS = ("sglang",)
_RECORD = engines.ENGINES["sglang"]
IN_FLIGHT_GAUGES = (_RECORD.running_metric, _RECORD.queue_metric)
#: The file under the work dir holding the flags that must not be on argv (the API key).
CONFIG_FILE = "sglang-args.yaml"


def parse_metrics_in_flight(body: bytes) -> int | None:
    """Requests running plus queued, from SGLang's /metrics; None unless both gauges are there."""
    return base.sum_gauges(body, IN_FLIGHT_GAUGES)


def write_config(path: str, values: dict[str, str]) -> None:
    """Write ``values`` as SGLang's YAML config, readable by its owner only.

    Each value is a JSON string, which YAML reads as the same string whatever it holds.
    Created 0600 before anything is written, so the key is never readable by others.
    """
    text = "".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # an existing file keeps its mode through O_CREAT
        f.write(text)


#: The SGLang whose LoRA flags (``adapters.sglang_args``) were checked against its parser: older ones are refused.
LORA_CHECKED = "0.5.23"


class Sglang:
    """Adapter for SGLang's OpenAI-compatible server."""

    name = "sglang"
    health_path = "/health"

    def __init__(self, *, python: str = sys.executable,
                 run: Callable[[list[str]], str] = base.run_python) -> None:
        self.python = python
        self._versions = base.VersionCache(DISTRIBUTIONS, run)

    def validate(self, spec: shards.ShardSpec, *, node: enginecheck.NodeFacts | None = None,
                 model: inventory.WeightFile | None = None) -> None:
        base.check_common(self.name, spec, node=node, model=model)
        base.require_weights_dir(self.name, spec)

    def launch(self, spec: shards.ShardSpec, *, host: str, port: int, model_path: str | None,
               cpu_count: int, node: enginecheck.NodeFacts = enginecheck.NodeFacts(), work_dir: str = "",
               python: str | None = None, tls: base.TlsFiles | None = None,
               lora_paths: tuple[str, ...] = ()) -> base.Launch:
        """``lora_paths``: the directories of ``spec.adapters``, in their order (``adapters.sglang_args``)."""
        self.validate(spec, node=node)
        if lora_paths:
            self._check_lora(spec, python or self.python)
        model_path = base.require_model_dir(spec, model_path)
        worker = spec.nnodes > 1 and spec.rank > 0
        argv = [python or self.python, "-m", MODULE, "--model-path", model_path,
                "--served-model-name", spec.served_name, "--host", host, "--port", str(port),
                "--tp-size", str(spec.tensor_parallel), "--pp-size", str(spec.pipeline_parallel),
                "--enable-metrics"]
        argv += base.profile_flags(self.name, spec, node, memory_flag="--mem-fraction-static")
        if not spec.gpus:
            argv += ["--device", "cpu"]
        if spec.nnodes > 1:
            argv += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.rank),
                     "--dist-init-addr", f"{spec.leader_addr}:{spec.leader_port}"]
        if spec.api_key and not worker:
            if not work_dir:
                raise errors.EngineError(f"shard {spec.shard_id}: sglang takes its API key only as a flag or in "
                                         "a config file, and no private work dir was given for the file; the "
                                         "agent must give one (llmgw puts no key on a command line)")
            path = os.path.join(work_dir, CONFIG_FILE)
            write_config(path, {"api-key": spec.api_key})
            argv += ["--config", path]
        if tls is not None and not worker:
            argv += ["--ssl-keyfile", tls.key, "--ssl-certfile", tls.cert]
        argv += adapters.sglang_args(spec.adapters, lora_paths) if lora_paths else ()
        argv += spec.args
        env = {"HF_HUB_OFFLINE": "1", **base.work_dir_env(work_dir, (("TMPDIR", ""), ("HF_HOME", "hf")))}
        env |= base.multinode_env(spec, node)
        env |= base.spec_env(spec)
        return base.Launch(argv=argv, env=env, serves_http=not worker)

    def probe(self) -> str | None:
        return self._versions.get(self.python)

    def _check_lora(self, spec: shards.ShardSpec, python: str) -> None:
        """EngineError when the SGLang that would run is older than the one whose LoRA flags llmgw checked."""
        found = self._versions.get(python)
        if found and _release(found) < _release(LORA_CHECKED):
            raise errors.EngineError(
                f"shard {spec.shard_id}: SGLang {found} is older than {LORA_CHECKED}, the release whose LoRA flags "
                "llmgw starts it with (--enable-lora, --max-lora-rank, --max-loras-per-batch, --lora-paths "
                f"NAME=DIR, checked against its parser); install SGLang {LORA_CHECKED} or newer on this node "
                "(`llmgw engine install`), pin spec.engine_version to it, or remove the model's adapters")

    def in_flight_probe(self) -> base.InFlightProbe:
        return "/metrics", parse_metrics_in_flight


def _release(version: str) -> tuple[int, ...]:
    """(0, 5, 23) from "0.5.23" or "0.5.23.post1"; the parts that are not numbers end it."""
    out = []
    for part in version.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)
