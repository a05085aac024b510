"""A model needs an engine version its node lacks: the real server asks the real agent to install it, from the
cluster's own wheelhouse (served over HTTP on 127.0.0.1), and the replica starts from the install once Ready.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.testing import system as system_mod
from llmgw.testing import wheelhouse
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model

pytestmark = pytest.mark.timeout(400)
VERSION = "0.3.1"  # the sim engine's wheel, built by the test; the agent's built-in sim is llmgw's own version


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    wh = wheelhouse.fill(tmp_path_factory.mktemp("wheelhouse"), sim_versions=(VERSION,), xllamacpp=False)
    with wheelhouse.serve(wh, log_path=wh.parent / "http.log") as url:
        yield url


@pytest.fixture
def cluster(tmp_path: Path, index_url: str) -> Iterator[System]:
    with system_mod.running(tmp_path, server_args=["--engine-index", index_url, "--engine-find-links"],
                            agent_env={"LLMGW_AGENT_ENGINES_DIR": str(tmp_path / "engines"),
                                       "LLMGW_AGENT_OWN_PYTHON_ENGINES": "false"}) as s:
        yield s


def test_a_model_pinning_a_version_gets_it_installed_and_its_replica_runs_from_it(cluster: System) -> None:
    """The replica waits saying the install's progress, then runs from the install's python; remove removes it."""
    name = f"pinned-{uuid.uuid4().hex[:6]}"
    cluster.apply(sim_model(name, engine_version=VERSION))
    said: list[str] = []

    def ready() -> bool:
        st = cluster.model_status(name)
        if f"sim {VERSION} on node1" in st["message"]:
            said.append(st["message"])
        return bool(st["state"] == "Ready")
    wait_for(ready, timeout=240, interval=0.1, what="the model Ready from its install")
    assert any(f"Installing sim {VERSION} on node1" in m for m in said), said
    wide = subprocess.run([*LLMGW, "get", "nodes", "-o", "wide", "--url", cluster.url], capture_output=True,
                          text=True, timeout=60, env={**cluster.cli_env(), "COLUMNS": "400"}, check=False)
    assert f"sim {VERSION} py Ready" in wide.stdout, (wide.stdout, wide.stderr)
    pids = cluster.engine_pids("node1")
    assert pids
    programs = {Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode() for pid in pids}
    assert str(cluster.root / "engines" / f"sim-{VERSION}-py" / "bin" / "python") in programs, programs
    # Once no replica runs it, `engine remove` takes it off the node: its directory goes, and so does its report.
    cluster.request("DELETE", f"/api/v1/models/{name}")
    wait_for(lambda: not cluster.replicas(name), timeout=60, what="the model's replica gone")
    removed = subprocess.run([*LLMGW, "engine", "remove", "node1", "sim", VERSION, "--url", cluster.url],
                             capture_output=True, text=True, timeout=60, env=cluster.cli_env(), check=False)
    assert removed.returncode == 0, removed.stderr
    install_dir = cluster.root / "engines" / f"sim-{VERSION}-py"
    wait_for(lambda: not install_dir.exists(), timeout=60, what=f"{install_dir} removed")
    wait_for(lambda: not any(i["version"] == VERSION for n in cluster.get("/api/v1/engines")["nodes"]
                             for i in n["installs"]), timeout=30, what="the install no longer reported")


def test_with_model_installs_off_a_model_waits_saying_what_the_node_lacks(tmp_path: Path, index_url: str) -> None:
    """--no-model-installs: nothing is installed for a model; its message says the node lacks the version."""
    s = System(tmp_path, server_args=["--engine-index", index_url, "--engine-find-links", "--no-model-installs"],
               agent_env={"LLMGW_AGENT_ENGINES_DIR": str(tmp_path / "engines"),
                          "LLMGW_AGENT_OWN_PYTHON_ENGINES": "false"})
    try:
        s.start_server()
        s.start_agent("node1")
        s.apply(sim_model("off", engine_version=VERSION))
        wait_for(lambda: f"node1 lacks sim {VERSION}" in s.model_status("off")["message"], timeout=30,
                 what="the model's refusal")
        assert s.get("/api/v1/engines")["settings"]["models_trigger_installs"] is False
        time.sleep(3)  # passes enough for an install to have started (it starts within one) had one been asked for
        assert f"node1 lacks sim {VERSION}" in s.model_status("off")["message"]
        assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").iterdir())
    finally:
        s.close()
