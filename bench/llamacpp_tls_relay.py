"""What engine TLS costs on llama.cpp (the xllamacpp launcher's TLS relay), against the same engine in plain HTTP.

Starts the launcher on a tiny GGUF twice, plain and with an engine certificate (``--ssl-key-file``: llama.cpp on
loopback behind the relay in its process), and measures, rounds interleaved so the machine's load hits both:

* ``keepalive``: ``GET /health`` on a kept-alive connection (the relay's per-request cost);
* ``new_conn``: ``GET /health`` on a new connection each time (plus the TLS handshake);
* ``ttft``: a streamed chat's first content byte, a new connection each (llama.cpp closes a connection after a
  streamed answer, so a router pays a handshake per stream).

    .venv/bin/python bench/llamacpp_tls_relay.py --rounds 3

What it found (2 shared cores at load ~5, 3 interleaved rounds, p50): kept-alive request 0.30 -> 0.44-0.51 ms
(the relay: +0.14-0.2 ms); a new connection 0.71-0.77 -> 2.4-2.6 ms (the ECDSA P-256 handshake, +1.8 ms); a
streamed chat's first content byte on a new connection 2.4-2.7 -> 5.2-5.6 ms (+2.8 ms; one round 11.7 ms).
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

from llmgw.agent import enginetls
from llmgw.agent.engines import llamacpp
from llmgw.core import pki
from llmgw.testing import procs, tiny_gguf

NODE = "bench-node"
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
        "ignore_eos": True}


def start(work: Path, model: Path, tls: bool) -> tuple[subprocess.Popen[bytes], str]:
    port = procs.free_port()
    argv = [sys.executable, llamacpp.launcher_file(), "--model", str(model), "--port", str(port), "--alias", "t",
            "--threads", "1", "--ctx-size", "512", "--parallel", "2"]
    if tls:
        argv += ["--ssl-key-file", str(work / "engine.key"), "--ssl-cert-file", str(work / "engine.crt")]
    log = work / f"engine-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    procs.wait_for(lambda: b"llamacpp_launcher:" in log.read_bytes(), timeout=60, what="the launcher")
    return proc, f"{'https' if tls else 'http'}://127.0.0.1:{port}"


def measure(url: str, verify: object, n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with httpx.Client(verify=verify, timeout=30) as c:  # type: ignore[arg-type]
        for _ in range(20):
            c.get(url + "/health")
        t = []
        for _ in range(n):
            t0 = time.perf_counter()
            c.get(url + "/health")
            t.append(time.perf_counter() - t0)
        out["keepalive_p50_ms"] = statistics.median(t) * 1e3
    t = []
    for _ in range(n // 4):
        t0 = time.perf_counter()
        with httpx.Client(verify=verify, timeout=30) as c:  # type: ignore[arg-type]
            c.get(url + "/health")
        t.append(time.perf_counter() - t0)
    out["new_conn_p50_ms"] = statistics.median(t) * 1e3
    t = []
    for _ in range(n // 4):
        t0, first = time.perf_counter(), None
        with httpx.Client(verify=verify, timeout=30) as c, c.stream("POST", url + "/v1/chat/completions",  # type: ignore[arg-type]
                                                                   json=CHAT) as r:
            for line in r.iter_lines():
                if first is None and '"content"' in line:
                    first = time.perf_counter() - t0
        if first is not None:
            t.append(first)
    out["ttft_p50_ms"], out["ttft_p99_ms"] = statistics.median(t) * 1e3, sorted(t)[int(len(t) * 0.99) - 1] * 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = tiny_gguf.write_tiny_llama_gguf(work / "tiny.gguf")
        ca, key = pki.create_ca(), pki.new_key()
        (work / "engine.key").write_bytes(pki.key_pem(key))
        os.chmod(work / "engine.key", 0o600)
        (work / "engine.crt").write_bytes(pki.sign_engine_csr(ca, pki.create_csr(NODE, key), NODE))
        client_tls = enginetls.client_context(ca.cert_pem, NODE)
        for i in range(ns.rounds):
            for tls in (False, True):
                proc, url = start(work, model, tls)
                try:
                    got = measure(url, client_tls if tls else False, ns.requests)
                finally:
                    proc.terminate()
                    proc.wait(10)
                print(json.dumps({"round": i, "tls": tls, **{k: round(v, 3) for k, v in got.items()}}), flush=True)


if __name__ == "__main__":
    main()
