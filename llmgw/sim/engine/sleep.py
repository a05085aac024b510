"""vLLM's sleep mode, mimicked: ``POST /sleep?level=1|2``, ``POST /wake_up``, ``GET /is_sleeping``.

As vLLM (``vllm/entrypoints/openai/api_server.py``, later ``vllm/entrypoints/serve/``;
https://docs.vllm.ai/en/latest/features/sleep_mode/): the routes exist only when the engine was started
with sleep mode (``--enable-sleep-mode``) and its server runs in dev mode (``VLLM_SERVER_DEV_MODE=1`` in its
environment); else they are 404. ``/sleep`` and
``/wake_up`` answer 200 with an empty body once done, ``/is_sleeping`` answers ``{"is_sleeping": bool}``;
newer vLLM's ``/sleep`` also takes ``mode`` (``abort`` by default, ``wait`` for the requests in flight),
which older ones ignore. vLLM's ``/health`` answers 200 while it sleeps (503 only for a dead engine), as here.
Level 1 offloads the weights to host memory and drops the KV cache; level 2 drops both (a wake reloads
them). vLLM's sleep mode is CUDA and ROCm only ("This feature is now supported on CUDA and ROCm
platform", the page above): vLLM on CPU cannot sleep.

The timings (``--wake-delay``, ``--sleep-delay``, seconds): vLLM's blog "Zero-Reload Model Switching with
vLLM Sleep Mode" (2025-10-03) measured a wake from level 1 in about 0.1-0.4 s for models of 0.6B-8B on one
GPU, and sleep in a similar time; level 2 wakes are a reload of the weights from disk. The defaults
(0.3 s to wake, 0.1 s to sleep) sit inside that; level 2 adds ``--level2-extra-delay``.

While asleep the sim reports what a real GPU would show: ``memory_mib`` in ``/sim/stats`` drops to the
small share vLLM keeps (``--sleep-memory-mib``, default 0), and a completion is refused with 503 (a
router never sends one: the control plane marks the replica Sleeping and the router holds its requests).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable

from aiohttp import web

from .protocol import dumps, error

#: ``/sleep``'s ``mode`` (newer vLLM): abort the requests in flight, wait for them, or keep them paused.
MODES = ("abort", "wait", "keep")
#: The variable vLLM reads before it serves its dev routes (/sleep among them).
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"


@dataclasses.dataclass(frozen=True, slots=True)
class SleepConfig:
    """The sim's sleep mode; ``enabled`` False: the routes are 404, as vLLM's without the flag."""

    enabled: bool = False
    wake_delay: float = 0.3
    sleep_delay: float = 0.1
    level2_extra_delay: float = 1.0
    #: Accelerator memory the engine holds awake (the sim's stand-in for nvidia-smi's per-process figure).
    memory_mib: int = 0
    sleep_memory_mib: int = 0


class SleepMode:
    """Whether the engine sleeps, and at which level; one lock so a sleep and a wake never overlap."""

    def __init__(self, config: SleepConfig, *, clock: Callable[[], float],
                 busy: Callable[[], bool] = lambda: False) -> None:
        self.config = config
        self.clock = clock
        #: Whether requests run or wait at the engine (``mode=wait`` sleeps once none does).
        self.busy = busy
        self.level = 0  # 0: awake
        self.sleeps = 0
        self.wakes = 0
        self._lock = asyncio.Lock()

    @property
    def sleeping(self) -> bool:
        return self.level > 0

    def memory_mib(self) -> int:
        return self.config.sleep_memory_mib if self.sleeping else self.config.memory_mib

    def routes(self, app: web.Application) -> None:
        """Add the three routes where vLLM would have them (sleep mode on and dev mode set)."""
        if not (self.config.enabled and os.environ.get(DEV_MODE_ENV) == "1"):
            return
        app.router.add_post("/sleep", self.sleep)
        app.router.add_post("/wake_up", self.wake_up)
        app.router.add_get("/is_sleeping", self.is_sleeping)

    async def sleep(self, request: web.Request) -> web.Response:
        raw = request.query.get("level", "1")
        if raw not in ("1", "2"):
            return error(400, f"level must be 1 or 2, got {raw!r}", type_="invalid_request_error")
        mode = request.query.get("mode", "abort")
        if mode not in MODES:
            return error(400, f"mode must be one of {', '.join(MODES)}, got {mode!r}", type_="invalid_request_error")
        while mode == "wait" and self.busy():  # noqa: ASYNC110 (the slots have no event to wait on)
            await asyncio.sleep(0.01)  # vLLM's mode=wait: the requests in flight finish first
        async with self._lock:
            if not self.sleeping:
                await asyncio.sleep(self.config.sleep_delay)
                self.level = int(raw)
                self.sleeps += 1
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        async with self._lock:
            if self.sleeping:
                extra = self.config.level2_extra_delay if self.level == 2 else 0.0
                await asyncio.sleep(self.config.wake_delay + extra)
                self.level = 0
                self.wakes += 1
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.sleeping}, dumps=dumps)

    def stats(self) -> dict[str, object]:
        return {"sleeping": self.sleeping, "level": self.level, "sleeps": self.sleeps, "wakes": self.wakes,
                "memory_mib": self.memory_mib(), "pid": os.getpid()}
