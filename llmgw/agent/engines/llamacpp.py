"""The llama.cpp adapter: llama-server when it is on PATH, else the xllamacpp launcher.

A ``llama-server`` binary is preferred because it is what an operator built
for the machine (CUDA, Metal, a tuned BLAS). Without one, the xllamacpp wheel
runs the same C++ server in-process under ``llmgw.agent.engines.llamacpp_launcher``,
which takes the llama-server flags used here, so the argv differs only in its
program.

A drain asks ``/metrics`` (the adapter always passes ``--metrics``) for
``llamacpp:requests_processing`` plus ``llamacpp:requests_deferred``, not
``/slots``: measured on xllamacpp 2026.10 with ``--parallel 1`` and four
streams sent at once, ``/slots`` showed one busy slot while ``/metrics`` said
1 processing and 3 deferred; the three queued requests are invisible in
``/slots``, and a drain that trusted it would stop the engine under them.
Both paths need the API key when one is set.

The version reported for ``llama-server`` is its build number as llama.cpp's
releases are tagged ("b4567"), read from ``llama-server --version`` (which
prints ``version: 4567 (abcdef12)`` on stderr); for the wheel it is
xllamacpp's package version. A model's ``engine_version`` is matched against
these. Running ``--version`` is the one process an adapter starts: a probe that
exits at once, not an engine, and its answer is kept until the binary changes.

On a replica given no GPU, prompts are evaluated 64 tokens per decode call
(``--batch-size 64``) unless the model's engine args say otherwise: llama.cpp
stops a request whose client left only between two such calls, once a progress
event it writes fails (the router asks for those: ``router/request.py``), so at
its default of 2048 a prompt's whole prefill runs first. Measured with SmolLM2 on
one thread (``bench/disconnect_abort.py``): aborted 0.5 s after the disconnect at
64 against 4.2 s at 2048, and 1,680 prompt tokens took 7.8 s at 64, 8.0 s at
2048 (at 32: 12.1 s, so not lower). On a GPU a 2048-token batch takes milliseconds
and a smaller one only costs throughput, so GPU replicas keep llama.cpp's default.

That batch also bounds embeddings: a model started with ``--embeddings`` (engine args)
embeds an input in one physical batch (at most ``--batch-size``) and answers a longer
one 500 "input (N tokens) is too large to process" (the router relays it as the client's
400, ``context_length_exceeded``), so a CPU replica embeds at most 64 tokens unless its
engine args raise ``--batch-size``. The 64 stays for embedding models
too: at 512 a routed client's leave stopped a 400-token prefill after 5.2 s (p50), at 64
after 0.68 s (``bench/disconnect_abort.py --trials 3``, one thread, 2026-12-05).

Threads default to half the CPUs, not llama.cpp's all of them: two busy
llama.cpp servers each spinning on all 8 vCPUs fell to 0.8 tok/s apiece, where
at 4 threads they kept 5.5.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

from llmgw.agent.engines import base
from llmgw.core import enginecheck, engines, errors, inventory, shards

#: The module run with ``python -m`` when there is no llama-server binary.
LAUNCHER_MODULE = "llmgw.agent.engines.llamacpp_launcher"
#: Prompt tokens per decode call on a replica without a GPU (see the module docstring).
CPU_BATCH = 64
_BATCH_FLAGS = ("-b", "--batch-size")
#: The gauges of /metrics whose sum is the requests in flight: running plus queued, from the record.
IN_FLIGHT_GAUGES = (engines.ENGINES["llamacpp"].running_metric, engines.ENGINES["llamacpp"].queue_metric)


def parse_metrics_in_flight(body: bytes) -> int | None:
    """Requests processing plus deferred, from llama.cpp's Prometheus text; None unless both are there."""
    found: dict[str, float] = {}
    for line in body.decode("utf-8", errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name in IN_FLIGHT_GAUGES:
            try:
                found[name] = float(value.split()[0])
            except (ValueError, IndexError):
                return None
    if len(found) != len(IN_FLIGHT_GAUGES):
        return None
    return int(sum(found.values()))


_VERSION_LINE = re.compile(r"^version:\s*(\d+)\b", re.MULTILINE)
#: Long enough for a binary on a cold network filesystem; short enough not to stall a heartbeat.
VERSION_TIMEOUT_S = 10.0


def parse_version(output: str) -> str:
    """"b4567" from ``llama-server --version``'s output; "" when it says no build number."""
    found = _VERSION_LINE.search(output)
    return f"b{found.group(1)}" if found else ""


def run_version(path: str) -> str:
    """The output (stdout and stderr) of ``path --version``; "" when it cannot be run."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, errors="replace",
                              timeout=VERSION_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


def launcher_file() -> str:
    """The launcher as a file, for an install's python that has no llmgw to run it as a module."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "llamacpp_launcher.py")


def default_threads(cpu_count: int) -> int:
    """Half the CPUs, at least one."""
    return max(1, cpu_count // 2)


class LlamaCpp:
    """Adapter for llama.cpp's HTTP server."""

    name = "llamacpp"
    health_path = "/health"

    def __init__(self, *, which: Callable[[str], str | None] = shutil.which,
                 version_of: Callable[[str], str] = run_version, python: str | None = None,
                 version: str | None = None) -> None:
        # Injected so tests choose between llama-server and the launcher without touching PATH.
        self._which, self._version_of = which, version_of
        # An install of xllamacpp (llmgw.agent.provision): its python runs the launcher by file path (the
        # launcher imports only xllamacpp and the standard library), and a llama-server on PATH is not used:
        # a node runs what llmgw installed and saw run, not whatever binary happens to be there.
        self._python, self._version = python, version
        #: (path, size, mtime) of the binary last asked, and its version.
        self._known: tuple[tuple[str, int, int], str] | None = None

    def validate(self, spec: shards.ShardSpec, *, node: enginecheck.NodeFacts | None = None,
                 model: inventory.WeightFile | None = None) -> None:
        base.check_common(self.name, spec, node=node, model=model)
        if not spec.source:
            raise errors.EngineError(f"shard {spec.shard_id}: llamacpp needs a .gguf model; set spec.source "
                                     "(file:///path/to/model.gguf or pkg:DISTRIBUTION)")
        if model is not None and model.format != "gguf":
            raise errors.EngineError(f"shard {spec.shard_id}: llamacpp loads a .gguf file, and {model.path} is "
                                     f"{model.format}; point spec.source at a .gguf or use engine vllm")
        if spec.dtype:
            raise errors.EngineError(f"shard {spec.shard_id}: llamacpp runs the types its .gguf file holds, so "
                                     f"dtype {spec.dtype} cannot be applied; remove spec.dtype or use a .gguf "
                                     "quantized to what you want")

    def launch(self, spec: shards.ShardSpec, *, host: str, port: int, model_path: str | None,
               cpu_count: int, node: enginecheck.NodeFacts = enginecheck.NodeFacts(), work_dir: str = "",
               python: str | None = None, tls: base.TlsFiles | None = None,
               lora_paths: tuple[str, ...] = ()) -> base.Launch:
        """``lora_paths``: the files of ``spec.adapters``, in their order (a request's ``lora`` id is the index),
        loaded at scale 0 (``--lora-init-without-apply``): only a request for an adapter applies it."""
        # node and work_dir are unused: llama.cpp runs one process on one node and keeps no cache.
        self.validate(spec)
        if not model_path:
            raise errors.EngineError(f"shard {spec.shard_id}: no model file was resolved for source "
                                     f"{spec.source!r}; set spec.source to a .gguf the node has")
        server = None if self._python else self._which("llama-server")
        if self._python:
            program = [python or self._python, launcher_file()]
        else:
            program = [server] if server else [python or sys.executable, "-m", LAUNCHER_MODULE]
        threads = spec.threads or default_threads(cpu_count)
        argv = [*program, "--model", model_path, "--host", host, "--port", str(port),
                "--alias", spec.served_name, "--threads", str(threads), "--metrics"]
        if spec.context_length:
            argv += ["--ctx-size", str(spec.context_length)]
        if not spec.gpus and not any(a in _BATCH_FLAGS or a.startswith("--batch-size=") for a in spec.args):
            argv += ["--batch-size", str(CPU_BATCH)]
        if tls is not None:
            # llama-server's own flags (a build with SSL serves TLS itself); the launcher takes the same and,
            # the xllamacpp wheels being built without SSL, serves them from a relay in its process.
            argv += ["--ssl-key-file", tls.key, "--ssl-cert-file", tls.cert]
        for path in lora_paths:
            argv += ["--lora", path]
        if lora_paths:
            argv.append("--lora-init-without-apply")
        argv += spec.args
        # The key by environment (llama-server and the launcher both read LLAMA_API_KEY), not argv.
        return base.Launch(argv=argv, env={**base.spec_env(spec), **base.api_key_env(self.name, spec)})

    def probe(self) -> str | None:
        if self._version is not None:
            return self._version
        if server := self._which("llama-server"):
            return self._server_version(server)
        try:
            return importlib.metadata.version("xllamacpp")
        except importlib.metadata.PackageNotFoundError:
            return None

    def in_flight_probe(self) -> base.InFlightProbe:
        return "/metrics", parse_metrics_in_flight

    def _server_version(self, path: str) -> str:
        """The binary's version ("" when it does not say), asked again only when the file changes."""
        try:
            st = os.stat(path)
            key = (path, st.st_size, st.st_mtime_ns)
        except OSError:
            key = (path, -1, -1)
        if self._known is None or self._known[0] != key:
            self._known = (key, parse_version(self._version_of(path)))
        return self._known[1]
