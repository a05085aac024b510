"""KV-aware routing end to end: sim engines publish vLLM's KV events to a real agent, which sends sampled
digests over its mutual-TLS stream to the server; the server relays them to its in-process router and to a
standalone `llmgw router` with two workers (``GET /api/v1/router/kv``, through the router's hub), whose
``kv_aware`` then sends a prompt to the replica whose engine holds its prefix, and stops doing so once that
engine's cache is gone (the engine restarted). A restarted control plane gets every set again from the agents
(the resend after each Register, as after a failover).

The prefix is put into one engine's cache directly (not through a router), so no router's own guess
(``prefix_cache``) can know it: only the engines' events can. Prompts are token ids (the router has no
tokenizer: ``kv_aware`` needs ids).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil

from llmgw.core import kvdigest, kvhash
from llmgw.testing.procs import Proc, free_port, wait_for
from llmgw.testing.system import LLMGW, System, running, sim_model

BLOCKS = 48


def _prefix(seed: int) -> list[int]:
    return [(seed * 7919 + i * 131) % 30000 + 1 for i in range(16 * BLOCKS)]


def _sampled_keys(tokens: list[int]) -> list[int]:
    return [k for k in (int(kvhash.external(h)) for h in kvhash.block_hashes(tokens, 16)) if kvdigest.sampled(k, 8)]


def _engine(system: System, endpoint: str) -> tuple[int, str]:
    """The pid and API key of the engine serving ``endpoint`` (its --port), read from the process."""
    port = endpoint.rsplit(":", 1)[1]
    for pid in system.engine_pids():
        try:
            proc = psutil.Process(pid)
            argv = proc.cmdline()
            if "--port" in argv and argv[argv.index("--port") + 1] == port:
                return pid, proc.environ().get("LLMGW_SIM_API_KEY", "")
        except psutil.Error:
            continue
    raise AssertionError(f"no engine process serves {endpoint}")


def _relayed(system: System, token: str) -> dict[str, set[int]]:
    """Every replica's sampled set as the leader's relay has it now (a reset: after=-1)."""
    from llmgw.api import kvdocs

    resp = system.request("GET", "/api/v1/router/kv?after=-1&timeout=0", headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 200, resp.text
    doc = kvdocs.KvDoc.from_doc(resp.json())
    return {c.replica_id: set(c.added) for c in doc.changes if not c.gone}


def _upstream(url: str, prompt: list[int], headers: dict[str, str]) -> str:
    r = httpx.post(url, json={"model": "kv", "prompt": prompt, "max_tokens": 1}, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.headers["x-llmgw-upstream"]


def test_kv_aware_follows_the_engines_caches_through_the_relay(tmp_path: Path) -> None:
    with running(tmp_path) as s:
        s.apply(sim_model("kv", replicas=2, routing="kv_aware",
                          args=["--prefill-tps", "200000", "--decode-tps", "2000"]))
        s.wait_model("kv", timeout=60)
        s.wait_router("kv", 2)
        token = s.request("POST", "/api/v1/routers", json={"name": "edge-kv"}).json()["token"]
        # A router-only path: an admin's token does not read the engines' caches.
        assert s.request("GET", "/api/v1/router/kv?timeout=0").status_code == 403
        token_file = tmp_path / "router.token"
        token_file.write_text(token + "\n")
        port = free_port()
        # With two workers: each follows the relay through the router's hub.
        edge = Proc.start([*LLMGW, "router", "--control", s.url, "--port", str(port), "--token-file", str(token_file),
                           "--workers", "2"], log_path=tmp_path / "router.log")
        try:
            routers = {"in-process": (f"{s.url}/v1/completions", {"Authorization": f"Bearer {s.token}"}),
                       "standalone": (f"http://127.0.0.1:{port}/v1/completions", {})}
            wait_for(lambda: _serving(routers["standalone"][0]), timeout=30, interval=0.2, what="the router")
            replicas = {r["id"]: r["endpoint"] for r in s.replicas("kv")}
            holder, other = sorted(replicas)
            prompt, second = _prefix(1), _prefix(2)
            keys, keys2 = _sampled_keys(prompt), _sampled_keys(second)
            assert keys and keys2, "each prompt has a sampled block (fixed prompts: this never moves)"
            # Each engine holds one prompt: a router that guessed could not place both right, every time.
            _direct(s, replicas[holder], prompt)
            _direct(s, replicas[other], second)
            wait_for(lambda: set(keys) <= _relayed(s, token).get(holder, set())
                     and set(keys2) <= _relayed(s, token).get(other, set()), timeout=20, interval=0.1,
                     what="both engines' blocks relayed")
            assert not set(keys) & _relayed(s, token).get(other, set())
            time.sleep(1.5)  # the routers' long polls answer within a coalescing interval (0.25 s) of the relay
            for name, (url, headers) in routers.items():
                for turn in range(4):  # later turns: the shared prefix and a new tail (over both workers)
                    assert _upstream(url, prompt + [7, 8, 9 + turn], headers) == holder, name
                    assert _upstream(url, second + [7, 8, 9 + turn], headers) == other, name
            # A new control plane (restarted here; a standby taking over is the same to the relay: a process that
            # knows nothing): each agent registers with it and sends its whole sets again, unasked.
            s.stop_server()
            s.start_server()
            wait_for(lambda: set(keys) <= _relayed(s, token).get(holder, set())
                     and set(keys2) <= _relayed(s, token).get(other, set()), timeout=60, interval=0.2,
                     what="both engines' blocks resent to the new control plane")
            s.wait_router("kv", 2, timeout=30)
            time.sleep(6.0)  # the standalone router's feed retries with backoff (at most 5 s) and takes a reset
            for name, (url, headers) in routers.items():
                assert _upstream(url, prompt + [4, 4], headers) == holder, name
                assert _upstream(url, second + [4, 4], headers) == other, name
            # The holder's engine restarts: its cache is empty, its set cleared; put the prefix in the other's.
            pid, _ = _engine(s, replicas[holder])
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not set(keys) & _relayed(s, token).get(holder, set()),
                     timeout=30, interval=0.1, what="the restarted engine's set cleared")
            s.wait_model("kv", timeout=60)
            s.wait_router("kv", 2, timeout=30)
            replicas = {r["id"]: r["endpoint"] for r in s.replicas("kv")}
            _direct(s, replicas[other], prompt)
            wait_for(lambda: set(keys) <= _relayed(s, token).get(other, set()), timeout=20, interval=0.1,
                     what="the other's blocks relayed")
            assert all(not set(keys) & v for r, v in _relayed(s, token).items() if r != other)
            # The restarted holder's engine now holds nothing: the first prompt goes where the second was sent too.
            time.sleep(1.5)
            for name, (url, headers) in routers.items():
                picked = {_upstream(url, prompt + [5, 6, turn], headers) for turn in range(3)}
                assert picked == {other}, name
        finally:
            edge.stop()


def _serving(url: str) -> bool:
    try:
        r = httpx.post(url, json={"model": "kv", "prompt": [1, 2, 3], "max_tokens": 1}, timeout=10)
        return r.status_code == 200
    except httpx.ConnectError:
        return False


def _direct(s: System, endpoint: str, prompt: list[int]) -> Any:
    """The prompt sent to one engine itself, past every router: only its KV events can tell a router."""
    _, key = _engine(s, endpoint)
    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key=key or "none", max_retries=0, timeout=30)
    done = client.completions.create(model="kv", prompt=prompt, max_tokens=1)
    assert done.usage is not None and done.usage.prompt_tokens == len(prompt)
    return done
