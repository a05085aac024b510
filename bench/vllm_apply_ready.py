"""Apply -> Ready -> first token for a vLLM CPU replica through llmgw, beside the same vLLM started by hand.

What a user waits for after ``llmgw apply``, split where the time goes:

* **install-free start** (llmgw's own): apply over REST -> the engine process is first seen among
  the agent's children (polled every 20 ms): the control plane's placement, the command on the
  agent's stream, the agent's checks and its launch. Nothing is installed: the engine's python is
  configured on the node.
* **engine init** (vLLM's): spawned -> the engine's own ``/health`` answers 200 (polled by this
  script directly every 20 ms at the port read from the engine's command line).
* **ready lag** (llmgw's): ``/health`` 200 -> the model's status says Ready (the agent's readiness
  probe also waits for ``/v1/models`` to list the served name, then the heartbeat carries it).
* **first token**: Ready -> the first content chunk of a streamed chat through the router (including
  the router's table catching up with the control plane).

The peer is the same engine started by hand: the argv and the vLLM variables the agent gave the
engine in the first llmgw run (read from its ``/proc``), a fresh port and a fresh work dir, then
``/health`` polled and one streamed chat sent straight to it. Runs alternate (llmgw, hand, llmgw, ...)
so that load from elsewhere on the machine falls on both. Medians of ``--runs`` each.

    .venv/bin/python bench/vllm_apply_ready.py --runs 3
    .venv/bin/python bench/vllm_apply_ready.py --runs 1 --json bench/results/vllm_apply_ready.json

Needs ``.venv-vllm`` (``make test-engines`` builds it) or ``--vllm-python``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import psutil

from llmgw.testing.procs import free_port, wait_for
from llmgw.testing.system import System

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-vllm"
POLL_S = 0.02
#: The variables the peer takes from the agent's launch: vLLM's and the Hub's, nothing of llmgw's.
PEER_ENV_PREFIXES = ("VLLM_", "HF_")
PEER_WORK_VARS = {"TMPDIR": "tmp", "VLLM_RPC_BASE_PATH": "rpc", "VLLM_CACHE_ROOT": "cache", "HF_HOME": "hf"}


def build_model(python: str, out: Path) -> Path:
    subprocess.run([python, "-m", "llmgw.testing.tiny_hf", str(out)], cwd=REPO, check=True, capture_output=True,
                   timeout=600)
    return out


def http_ok(url: str, *, key: str = "") -> bool:
    try:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(url, timeout=2, headers=headers, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def first_token(base: str, *, key: str, model: str, retry_503: bool) -> float:
    """Seconds to the first content chunk of a streamed chat (503s retried when the router lags the table)."""
    t0 = time.time()
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=60, trust_env=False, headers=headers) as http:
        while True:
            with http.stream("POST", base + "/v1/chat/completions", json=body) as r:
                if r.status_code == 503 and retry_503:
                    time.sleep(POLL_S)
                    continue
                if r.status_code != 200:
                    raise RuntimeError(f"chat answered {r.status_code}: {r.read()[:300]!r}")
                for line in r.iter_lines():
                    if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                        return time.time() - t0
    raise RuntimeError("the stream ended without content")


def engine_proc(agent_pid: int) -> psutil.Process | None:
    """The agent's child that carries a shard mark (not its version probes)."""
    try:
        for p in psutil.Process(agent_pid).children(recursive=False):
            if p.environ().get("LLMGW_SHARD_ID"):
                return p
    except psutil.Error:
        return None
    return None


def port_of(cmdline: list[str]) -> int:
    return int(cmdline[cmdline.index("--port") + 1])


def llmgw_run(system: System, model_dir: Path) -> tuple[dict[str, float], list[str], dict[str, str]]:
    agent = system.agents["node1"]
    doc = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": MODEL},
           "spec": {"engine": "vllm", "served_name": MODEL, "source": f"file://{model_dir}", "replicas": 1,
                    "context_length": 512, "resources": {"memory": "3GiB"}, "startup_timeout": "10m"}}
    t_apply = time.time()
    system.apply(doc)
    proc = wait_for(lambda: engine_proc(agent.pid), timeout=120, interval=POLL_S, what="engine spawned")
    # First seen, not psutil's create_time: that is boot time + jiffies, and boot time is known
    # only to about a second (it put the spawn 0.46 s before the apply here).
    t_spawn = time.time()
    assert isinstance(proc, psutil.Process)
    argv, env = proc.cmdline(), proc.environ()
    url = f"http://127.0.0.1:{port_of(argv)}"
    wait_for(lambda: http_ok(url + "/health"), timeout=600, interval=POLL_S, what="engine /health")
    t_health = time.time()
    system.wait_model(MODEL, timeout=600)
    t_ready = time.time()
    ttft = first_token(system.url, key="", model=MODEL, retry_503=True)
    system.request("DELETE", f"/api/v1/models/{MODEL}")
    wait_for(lambda: not system.replicas(MODEL) and not psutil.pid_exists(proc.pid), timeout=120, what="stopped")
    return ({"start": t_spawn - t_apply, "init": t_health - t_spawn, "ready_lag": t_ready - t_health,
             "first_token": ttft, "total": t_ready + ttft - t_apply}, argv, env)


def hand_run(argv: list[str], agent_env: Mapping[str, str], work_root: Path) -> dict[str, float]:
    """The agent's argv and vLLM variables on a fresh port and work dir, started and timed by hand."""
    port = free_port()
    argv = list(argv)
    argv[argv.index("--port") + 1] = str(port)
    work = Path(tempfile.mkdtemp(dir=work_root))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMGW_", *PEER_ENV_PREFIXES))}
    env.update({k: v for k, v in agent_env.items() if k.startswith(PEER_ENV_PREFIXES)})
    for var, sub in PEER_WORK_VARS.items():
        (work / sub).mkdir()
        env[var] = str(work / sub)
    url = f"http://127.0.0.1:{port}"
    log = open(work / "engine.log", "wb")
    t0 = time.time()
    p = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        wait_for(lambda: http_ok(url + "/health") or p.poll() is not None, timeout=600, interval=POLL_S,
                 what="hand-started /health")
        if p.poll() is not None:
            raise RuntimeError(f"vLLM started by hand exited with {p.returncode}; see {work / 'engine.log'}")
        t_health = time.time()
        ttft = first_token(url, key=env.get("VLLM_API_KEY", ""), model=MODEL, retry_503=False)
        return {"start": 0.0, "init": t_health - t0, "ready_lag": 0.0, "first_token": ttft,
                "total": t_health + ttft - t0}
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)  # its own group: it and its engine core and worker
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--json", help="also write the runs and medians here")
    a = parser.parse_args()
    # A short root: vLLM's IPC sockets go under the shard's work dir, and a unix socket path
    # longer than 107 bytes fails its start (seen for issue 11).
    with tempfile.TemporaryDirectory(prefix="lgb-") as tmp:
        root = Path(tmp)
        model_dir = build_model(a.vllm_python, root / "tiny-llama")
        system = System(root / "system", agent_env={"LLMGW_AGENT_VLLM_PYTHON": a.vllm_python})
        ours: list[dict[str, float]] = []
        hand: list[dict[str, float]] = []
        try:
            system.start_server()
            system.start_agent("node1")
            argv: list[str] = []
            env: dict[str, str] = {}
            for i in range(a.runs):
                got, argv, env = llmgw_run(system, model_dir)
                ours.append(got)
                print(f"llmgw run {i + 1}: " + " ".join(f"{k}={v:.2f}s" for k, v in got.items()), flush=True)
                got = hand_run(argv, env, root)
                hand.append(got)
                print(f"hand  run {i + 1}: " + " ".join(f"{k}={v:.2f}s" for k, v in got.items()), flush=True)
        finally:
            system.close()
        print(f"engine argv: {argv}")
        med = {side: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
               for side, runs in (("llmgw", ours), ("hand", hand))}
        print(f"\nmedians of {a.runs} run(s), seconds     llmgw     by hand   llmgw/hand")
        for k in ("start", "init", "ready_lag", "first_token", "total"):
            ratio = f"{med['llmgw'][k] / med['hand'][k]:8.2f}" if med["hand"][k] else "       -"
            print(f"  {k:<32}{med['llmgw'][k]:>8.2f}  {med['hand'][k]:>10.2f}   {ratio}")
        if a.json:
            Path(a.json).parent.mkdir(parents=True, exist_ok=True)
            Path(a.json).write_text(json.dumps({"runs": {"llmgw": ours, "hand": hand}, "median": med,
                                                "argv": argv}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
