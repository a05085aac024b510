"""One engine process, launched or adopted: the one owner of every outside call about it.

The supervisor's parts used to be handed ``recs, http, clock, interval_s,
give_up`` and to branch on "our child or an orphan" each in its own way. Now a
shard has one ``EngineProcess``, and every question to the engine goes through
it: is it ready (``check_ready``), does it still answer (``probe``), what does
it hold (``in_flight``); and every act on the process too: wait for it
(``wait``), end it (``terminate``), clean up after it (``sweep``), say how it
ended (``exit_code``, ``tail``, ``describe_exit``). The two kinds differ only
here: our child is waited on (an exit code, and the kernel reaps it), an
adopted one (``orphans.Orphan``) is polled by pid and start time and has no
exit code. What state the shard is in is not this object's business: that is
``records``', and ``watching`` and ``draining`` decide it from these answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import psutil

from llmgw.agent import engines
from llmgw.agent.supervisor import ending, launching, orphans, probing
from llmgw.core.shards import ShardSpec

#: Why an adopted engine's exit comes without a code.
ADOPTED_EXIT = "engine exited (exit code unknown: it was started by a previous agent)"


class EngineProcess:
    """An engine's process, its endpoint and its log: ``child`` (we launched it) or ``orphan`` (adopted)."""

    def __init__(self, spec: ShardSpec, plan: launching.Plan, *, http: Callable[[], aiohttp.ClientSession],
                 log_offset: int = 0, child: asyncio.subprocess.Process | None = None,
                 orphan: orphans.Orphan | None = None, in_flight_probe: engines.InFlightProbe | None = None,
                 poll_s: float = 0.5) -> None:
        if (child is None) == (orphan is None):
            raise ValueError("an engine process is either our child or an adopted one")
        self.spec, self.plan, self.log_offset = spec, plan, log_offset
        self._http, self._child, self._orphan = http, child, orphan
        self._in_flight_probe, self._poll_s = in_flight_probe, poll_s

    @property
    def pid(self) -> int:
        return self._child.pid if self._child is not None else self._orphan.pid  # type: ignore[union-attr]

    @property
    def serves_http(self) -> bool:
        """False for a worker rank that answers no HTTP: judged by staying alive, never probed."""
        return self.plan.serves_http

    @property
    def adopted(self) -> bool:
        """Started by a previous agent: no exit code, found gone by polling."""
        return self._orphan is not None

    @property
    def exit_code(self) -> int | None:
        """Our child's exit status once it has exited (negative: the signal); always None for an adopted one."""
        return self._child.returncode if self._child is not None else None

    async def wait(self) -> None:
        """Return once the process has exited (our child: reaped)."""
        if self._child is not None:
            await self._child.wait()
        else:
            assert self._orphan is not None
            await self._orphan.wait(interval_s=self._poll_s)

    def running(self) -> bool:
        """Whether the process still exists and is not a zombie (a small /proc read, done on the loop).

        Asked after a failed probe: an engine that has just died refuses the
        connection a moment before its exit is seen, and that is an exit to
        report, not a probe failure.
        """
        if self._orphan is not None:
            return self._orphan.alive()
        assert self._child is not None
        if self._child.returncode is not None:
            return False
        try:
            return psutil.Process(self._child.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    async def check_ready(self, *, timeout_s: float = probing.PROBE_TIMEOUT_S) -> str | None:
        """None once the engine answers its health path and lists its served model; else what is missing."""
        return await probing.probe(self._http(), self.plan.endpoint, health_path=self.plan.health_path,
                                   served_name=self.spec.served_name, api_key=self.spec.api_key,
                                   timeout_s=timeout_s)

    async def probe(self, *, timeout_s: float) -> str | None:
        """The liveness probe: None when its health path answers 200 in time; else why not, in words."""
        return await probing.health(self._http(), self.plan.endpoint, health_path=self.plan.health_path,
                                    api_key=self.spec.api_key, timeout_s=timeout_s)

    async def sleep(self, level: int) -> str | None:
        """Sleep at ``level`` (1, 2) or wake (0) through the engine's API; None when done, else why not."""
        return await probing.sleep(self._http(), self.plan.endpoint, level, api_key=self.spec.api_key)

    async def is_sleeping(self) -> bool | None:
        """Whether the engine sleeps (vLLM's ``/is_sleeping``); None when it does not say."""
        return await probing.is_sleeping(self._http(), self.plan.endpoint, api_key=self.spec.api_key)

    async def in_flight(self, *, timeout_s: float) -> tuple[int | None, str]:
        """Requests the engine holds, or None and in words why that is unknown."""
        if self._in_flight_probe is None:
            return None, "its engine's adapter has no in-flight probe"
        path, parse = self._in_flight_probe
        return await probing.in_flight(self._http(), self.plan.endpoint, path, parse, api_key=self.spec.api_key,
                                       timeout_s=timeout_s)

    async def terminate(self, *, grace_s: float) -> bool:
        """SIGTERM the group, SIGKILL it after ``grace_s``; True when it had to be killed.

        Returns once the process is gone (our child reaped, an adopted one no
        longer found by pid and start time). A frozen (SIGSTOP) engine leaves
        its SIGTERM pending for ever and is the SIGKILL's. The wait after
        SIGKILL is unbounded (a process in the kernel's uninterruptible sleep
        goes when it goes); the caller bounds how long it waits for that.
        """
        if self._orphan is not None:
            return await self._orphan.terminate(grace_s=grace_s)
        assert self._child is not None
        _, killed = await ending.terminate(self._child, grace_s=grace_s)
        return killed

    def sweep(self) -> None:
        """SIGKILL what is left of the group once the leader is gone: forked workers hold GPU memory."""
        if self._orphan is not None:
            self._orphan.sweep()
        else:
            ending.sweep_group(self.pid)

    async def remove_work_dir(self) -> None:
        """Remove the shard's work dir, once the process is gone (in a thread: a cache can be many files)."""
        if self.plan.work_dir is not None:
            await asyncio.to_thread(launching.remove_work_dir, self.plan.work_dir)

    def tail(self) -> tuple[str, ...]:
        """The last lines this run of the engine wrote (a bounded read of a local file, on the loop)."""
        return ending.tail(self.plan.log_path, self.log_offset)

    def describe_exit(self) -> str:
        """``"engine exited with code 1"``; an adopted engine's exit has no code to give."""
        if self._orphan is not None:
            return ADOPTED_EXIT
        return f"engine {ending.describe_exit(self.exit_code)}"
