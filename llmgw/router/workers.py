"""The hub's workers (``router.hub``): how each is started, kept running, and stopped.

Worker ``i`` is ``python -m llmgw.router.standalone --config FILE``: the ordinary router, its settings the
hub's own but where the hub says otherwise (``worker_settings``): it follows the hub (``--control
http://127.0.0.1:HUBPORT``), is router ``ROUTER_ID.wI``, keeps its usage journal in ``DIR/wI`` and never
has workers of its own. The file (0600, in the hub's 0700 directory) holds no secret: the hub's bearer
secret travels in the worker's environment (``LLMGW_ROUTER_TOKEN``), never on an argv, which every user
of the machine can read. The worker's environment loses every other ``LLMGW_ROUTER_*`` variable, since a
variable beats the settings file, and gains ``HUB_PID_ENV`` (the hub's pid: the worker listens with
SO_REUSEPORT and stops once its parent is not that pid).

``Supervisor`` restarts a worker that exits (``Backoff``: 0.5 s doubling to 10 s, back to 0.5 s once one
ran 30 s; one log line each, with its exit status) and, on ``stop``, sends SIGTERM to every worker, lets
them drain for the grace period (and a little), then sends SIGKILL, by pid, to those left.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from llmgw.api.reports import MAX_ROUTER_ID
from llmgw.core import settingsgen
from llmgw.router.settings import HUB_PID_ENV, HUB_STATIC_ENV, TOKEN_ENV, RouterSettings

log = logging.getLogger("llmgw.router.hub")

#: What a worker has beyond the grace period to finish after SIGTERM before it is killed.
EXTRA_GRACE_S = 3.0


@dataclasses.dataclass
class Backoff:
    """The wait before a worker that exited starts again: doubling from ``min_s`` to ``max_s``, and back to
    ``min_s`` after a run of ``reset_after_s`` (a worker that crashes once a day waits the least)."""

    min_s: float = 0.5
    max_s: float = 10.0
    reset_after_s: float = 30.0
    _next: float = 0.0

    def after_exit(self, ran_s: float) -> float:
        """The seconds to wait before the next start of a worker that ran ``ran_s`` seconds."""
        if ran_s >= self.reset_after_s or self._next <= 0:
            self._next = self.min_s
        delay = self._next
        self._next = min(self._next * 2, self.max_s)
        return delay


def worker_settings(settings: RouterSettings, index: int, *, hub_url: str, port: int) -> dict[str, Any]:
    """Worker ``index``'s settings file, by setting name: the hub's settings, where the hub says otherwise."""
    name = settings.router_id or _hostname()
    values: dict[str, Any] = {}
    for s in settingsgen.settings_of(RouterSettings):
        value: Any = settings
        for part in s.path:
            value = getattr(value, part)
        if value is None or value == ():
            continue
        values[s.name] = str(value) if isinstance(value, Path) else value
    values.pop("table_file", None)
    values.pop("token_file", None)
    # Workers follow the hub over loopback HTTP; the hub alone talks to (and verifies) the control plane.
    values.pop("control_ca", None)
    values.pop("control_ca_hash", None)
    suffix = f".w{index}"  # the name cut so the worker's id stays one the control plane takes
    values |= {"control": hub_url, "router_id": name[:MAX_ROUTER_ID - len(suffix)] + suffix, "port": port,
               "workers": 1}
    if settings.usage_journal_dir is not None:
        values["usage_journal_dir"] = str(settings.usage_journal_dir / f"w{index}")
    return values


def worker_env(env: Mapping[str, str], *, secret: str, hub_pid: int, static: bool = False) -> dict[str, str]:
    """A worker's environment: ``env`` without the router's variables, with the hub's secret and pid (and, over
    a static table, ``HUB_STATIC_ENV``)."""
    kept = {k: v for k, v in env.items() if not k.startswith(RouterSettings.ENV_PREFIX) and k != HUB_STATIC_ENV}
    return kept | {TOKEN_ENV: secret, HUB_PID_ENV: str(hub_pid)} | ({HUB_STATIC_ENV: "1"} if static else {})


def write_config(directory: Path, index: int, values: Mapping[str, Any]) -> Path:
    """Worker ``index``'s settings file in ``directory``, 0600."""
    path = directory / f"w{index}.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(dict(values), f)
    return path


def _hostname() -> str:
    import socket

    return socket.gethostname()


def describe(status: int) -> str:
    """An exit status as a person reads it: ``exit 2``, ``SIGKILL``."""
    if status < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-status).name
        return f"signal {-status}"
    return f"exit {status}"


def worker_argv(config: Path) -> list[str]:
    """The command of the worker whose settings file is ``config``."""
    return [sys.executable, "-m", "llmgw.router.standalone", "--config", str(config)]


class Supervisor:
    """Runs one process per config file (``argv(config)``), restarting any that exits until ``stop``."""

    def __init__(self, configs: list[Path], env: Mapping[str, str], *, grace_s: float,
                 argv: Callable[[Path], list[str]] = worker_argv, extra_grace_s: float = EXTRA_GRACE_S) -> None:
        self._configs = configs
        self._env = dict(env)
        self._argv = argv
        self._grace_s = grace_s + extra_grace_s
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: Starts per worker (1 each once all started; a restart adds one).
        self.starts = [0] * len(configs)

    @property
    def pids(self) -> list[int]:
        """The pids of the workers running now, in order."""
        return [p.pid for _, p in sorted(self._procs.items()) if p.returncode is None]

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._keep(i), name=f"llmgw-router-worker-{i}")
                       for i in range(len(self._configs))]

    async def _spawn(self, index: int) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(*self._argv(self._configs[index]), env=self._env,
                                                    stdin=asyncio.subprocess.DEVNULL)
        self._procs[index] = proc
        self.starts[index] += 1
        return proc

    async def _keep(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff()
        while not self._stopping.is_set():
            started = loop.time()
            try:
                proc = await self._spawn(index)
            except OSError as exc:
                status, proc_pid = f"could not start: {exc}", 0
            else:
                if self._stopping.is_set():  # started while ``stop`` was signalling the others
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
                status, proc_pid = describe(await proc.wait()), proc.pid
            if self._stopping.is_set():
                return
            delay = backoff.after_exit(loop.time() - started)
            log.warning("worker %d (pid %d) ended (%s) after %.1fs; starting it again in %gs", index, proc_pid,
                        status, loop.time() - started, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def stop(self) -> None:
        """SIGTERM to every worker, up to the grace period (and a little) to drain, then SIGKILL to those left."""
        self._stopping.set()
        for proc in self._procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        if not self._tasks:
            return
        # Each worker's task ends once its process exited (or, between two starts, at once).
        _, left = await asyncio.wait(self._tasks, timeout=self._grace_s)
        for proc in self._procs.values():
            if proc.returncode is None:
                log.warning("worker pid %d still running after %gs: killing it", proc.pid, self._grace_s)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        if left:
            _, stuck = await asyncio.wait(left, timeout=5.0)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
