"""A burst of OpenAI requests over several routers, with what each answer said: for the budget tests.

Each request is sent to one of the routers in turn, half of them streamed (asking for the usage chunk, so
the client sees what it was charged), all at once. ``Outcome`` keeps per answer its status, its usage and
its headers; ``Burst.summary`` adds them up so a test can hold them against the limit and the stored usage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from llmgw.testing.procs import Proc, free_port
from llmgw.testing.system import System


@dataclasses.dataclass(slots=True)
class Outcome:
    router: int
    stream: bool
    status: int = 0  # 0: no answer (the connection broke)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    error: str = ""
    body: str = ""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclasses.dataclass(slots=True)
class Summary:
    served: int
    refused: int
    broken: int
    prompt_tokens: int
    completion_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def summary(outcomes: Sequence[Outcome]) -> Summary:
    ok = [o for o in outcomes if o.status == 200]
    return Summary(served=len(ok), refused=sum(o.status == 429 for o in outcomes),
                   broken=sum(o.status not in (200, 429) for o in outcomes),
                   prompt_tokens=sum(o.prompt_tokens for o in ok),
                   completion_tokens=sum(o.completion_tokens for o in ok))


async def _one(client: httpx.AsyncClient, url: str, i: int, router: int, key: str, model: str,
               max_tokens: int) -> Outcome:
    stream = i % 2 == 1
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": f"request {i}"}],
                            "max_tokens": max_tokens}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    out = Outcome(router=router, stream=stream)
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key}"}) as resp:
            out.status = resp.status_code
            out.headers = {k.lower(): v for k, v in resp.headers.items()}
            text = (await resp.aread()).decode()
    except (httpx.HTTPError, OSError) as exc:
        out.status, out.error = 0, f"{type(exc).__name__}: {exc}"
        return out
    out.body = text[-2000:]
    if out.status != 200:
        return out
    usage: Any = None
    if stream:
        complete = False
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip() == "[DONE]":
                complete = True
            elif line.startswith("data:"):
                doc = json.loads(line[5:])
                if doc.get("usage"):
                    usage = doc["usage"]
        if not complete:
            out.status, out.error = 0, "stream cut before [DONE]"
            return out
    else:
        usage = json.loads(text).get("usage")
    if not usage:
        out.status, out.error = 0, "an answer without usage"
        return out
    out.prompt_tokens, out.completion_tokens = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    return out


async def burst(routers: Sequence[str | Callable[[], str]], key: str, model: str, *, n: int = 300,
                max_tokens: int = 100, midway: Callable[[], Any] | None = None) -> list[Outcome]:
    """``n`` requests at once, spread over ``routers``; ``midway`` runs (in a thread) after about half were sent."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:
        tasks = []
        for i in range(n):
            r = routers[i % len(routers)]
            url = r() if callable(r) else r
            tasks.append(asyncio.create_task(_one(client, url, i, i % len(routers), key, model, max_tokens)))
            if midway is not None and i == n // 2:
                await asyncio.sleep(0.05)
                await asyncio.to_thread(midway)
        return list(await asyncio.gather(*tasks))


class StandaloneRouter:
    """A standalone router process with its own credential and journal; restartable on the same journal."""

    def __init__(self, system: System, root: Path, name: str, *, controls: Sequence[str] = (),
                 workers: int = 1) -> None:
        made = system.request("POST", "/api/v1/routers", json={"name": name})
        assert made.status_code == 201, made.text
        self.token_file = root / f"{name}.token"
        self.token_file.write_text(made.json()["token"])
        self.token_file.chmod(0o600)
        self.controls = ",".join(controls) or system.url
        self.root, self.name = root, name
        self.journal = root / f"{name}-journal"
        self.port = free_port()
        self.workers = workers  # 1: one process; more: a hub and its workers (router.hub)
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = Proc.start([sys.executable, "-m", "llmgw.router.standalone", "--host", "127.0.0.1", "--port",
                                str(self.port), "--control", self.controls, "--token-file", str(self.token_file),
                                "--router-id", self.name, "--usage-journal-dir", str(self.journal),
                                # The burst comes from one address, with more connections than the default cap.
                                "--max-connections-per-address", "0", "--workers", str(self.workers)],
                               log_path=self.root / f"{self.name}.log")
        self.proc.wait_http(self.url + "/metrics", timeout=30)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.signal(signal.SIGKILL)
        self.proc.stop(timeout=10)  # reaps it

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
