"""Steady client load through the router for tests: completions back to back, every failure kept.

Half the clients stream, half do not; a stream counts as served only when it
ends with ``[DONE]`` and carries no error event, so an engine stopped under a
stream is a failure here even though its status line was 200.
"""

from __future__ import annotations

import threading

import httpx

from llmgw.testing.procs import wait_for


class Load:
    """Clients sending completions through the router back to back until stopped; every failure kept."""

    def __init__(self, url: str, model: str, *, clients: int = 4) -> None:
        self.url, self.model = url, model
        self.ok = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i % 2 == 0,), daemon=True) for i in range(clients)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _count(self, failure: str | None) -> None:
        with self._lock:
            if failure is None:
                self.ok += 1
            else:
                self.failures.append(failure)

    def _run(self, stream: bool) -> None:
        body = {"model": self.model, "prompt": "x", "max_tokens": 8, "stream": stream}
        with httpx.Client(timeout=30, trust_env=False) as c:
            while not self._stop.is_set():
                try:
                    if not stream:
                        r = c.post(f"{self.url}/v1/completions", json=body)
                        self._count(None if r.status_code == 200 and r.json()["choices"][0]["text"]
                                    else f"{r.status_code} {r.text[:200]}")
                        continue
                    with c.stream("POST", f"{self.url}/v1/completions", json=body) as r:
                        if r.status_code != 200:
                            r.read()
                            self._count(f"stream {r.status_code} {r.text[:200]}")
                            continue
                        lines = [x for x in r.iter_lines() if x]
                    done = lines and lines[-1] == "data: [DONE]"
                    self._count(None if done and not any('"error"' in x for x in lines)
                                else f"stream cut: {lines[-2:]}")
                except httpx.HTTPError as e:
                    self._count(repr(e))

    def wait_ok(self, n: int, *, timeout: float = 30) -> None:
        start = self.ok
        wait_for(lambda: self.ok >= start + n, timeout=timeout, what=f"{n} more requests served")
