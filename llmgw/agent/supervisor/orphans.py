"""Engines a previous agent started: finding them, recognising them, watching and ending them.

They are not our children, so there is no ``waitpid`` and no exit code: a
process is watched by polling, and identified by its pid *and* its start
time, because a pid the kernel handed to something else after the engine died
must never be signalled. Within one agent the identity is psutil's
(``Process.is_running`` compares the kernel's start time in ticks since boot,
which no clock change moves). Across agents the state file's
``create_time()`` is seconds since the epoch, and that one moves when the
system clock is stepped (psutil adds the boot time, which the kernel derives
from the wall clock); so the marker every engine carries in its environment
(``LLMGW_SHARD_ID`` and ``LLMGW_RUN_DIR``, set by ``launching``) decides
whenever it can be read, and the start time only when it cannot.

Only processes of a user this agent's engines may run as are looked at (the
agent's own, and as root the uids ``identity`` hands out: the caller says which);
one that vanishes or refuses while it is being read (NoSuchProcess,
AccessDenied, ZombieProcess) is skipped. Root reads the environment of every
user's process, so an engine under a uid of its own is still recognised by its
marker. This module is the supervisor's only use of psutil on processes it did
not start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Callable, Iterable

import psutil

from llmgw.agent.supervisor import ending, launching

#: How far apart two create_time() readings of one process may be across agents:
#: psutil's value has 10 ms resolution, and NTP slewing moves the boot time it adds.
START_TIME_SLACK_S = 1.0
_SKIP = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """A live process of this user, as observed once."""

    pid: int
    create_time: float
    pgid: int
    #: LLMGW_SHARD_ID and LLMGW_RUN_DIR from its environment; both None when it has
    #: none, and ``environ_read`` is False when the environment could not be read.
    shard_id: str | None = None
    run_dir: str | None = None
    environ_read: bool = True
    #: psutil's handle, which keeps the exact identity for a later signal.
    handle: psutil.Process | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Survey:
    """What one pass over the process table found."""

    #: The state files' pids: each one's process, or None when no live process of ours has it.
    by_pid: dict[int, Seen | None]
    #: Every live process of ours whose environment names ``run_dir``.
    marked: list[Seen]


def _observe(proc: psutil.Process) -> Seen | None:
    """The process as Seen, None when it is gone, a zombie, or not ours to read."""
    try:
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None  # dead: only its exit status is left for its parent to collect
            create_time = proc.create_time()
            pgid = os.getpgid(proc.pid)
        try:
            env = proc.environ()
        except psutil.AccessDenied:
            return Seen(proc.pid, create_time, pgid, environ_read=False, handle=proc)
        return Seen(proc.pid, create_time, pgid, shard_id=env.get(launching.SHARD_ENV),
                    run_dir=env.get(launching.RUN_DIR_ENV), handle=proc)
    except (*_SKIP, ProcessLookupError):
        return None


def _ours(proc: psutil.Process, ours: Callable[[int], bool]) -> bool:
    try:
        return ours(proc.uids().real)
    except _SKIP:
        return False


def survey(run_dir: str, pids: Iterable[int], *, ours: Callable[[int], bool] | None = None) -> Survey:
    """One look at the process table (blocking: /proc reads; the caller runs it in a thread).

    ``ours``: whether a process's real uid may be one of this agent's engines (default: the agent's own uid).
    """
    if ours is None:
        own = os.getuid()
        ours = own.__eq__
    by_pid: dict[int, Seen | None] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
        except _SKIP:
            by_pid[pid] = None
            continue
        by_pid[pid] = _observe(proc) if _ours(proc, ours) else None
    marked = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid() or not _ours(proc, ours):
            continue
        seen = by_pid.get(proc.pid) or _observe(proc)
        if seen is not None and seen.run_dir == run_dir:
            marked.append(seen)
    return Survey(by_pid=by_pid, marked=marked)


def kill(seen: Seen) -> bool:
    """SIGKILL ``seen`` and, when it leads its own group, the group; False when it was already gone.

    Its identity is checked first, so a process that exited since the survey
    and whose pid was reused is left alone. Only a group the process leads is
    signalled: one started by hand without a new session shares its parent's
    group, and killing that would take the shell (or the test runner) with it.
    """
    if seen.handle is None or not seen.handle.is_running():
        return False
    try:
        if seen.pgid == seen.pid and seen.pgid != os.getpgrp():
            os.killpg(seen.pgid, signal.SIGKILL)
        else:
            os.kill(seen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class Orphan:
    """An adopted engine: alive while its pid has its start time; signalled through its group."""

    def __init__(self, seen: Seen) -> None:
        assert seen.handle is not None
        self.pid = seen.pid
        self._proc = seen.handle
        # Our launches make every engine its group's leader; one that left its
        # group since is signalled alone, never the group it joined.
        self._group = seen.pgid == seen.pid

    def alive(self) -> bool:
        try:
            if not self._proc.is_running():
                return False
            if self._proc.status() != psutil.STATUS_ZOMBIE:
                return True
            self._reap()
            return False
        except _SKIP:
            return False

    def _reap(self) -> None:
        """A dead engine that is this process's own child is reaped: after `llmgw node upgrade` the agent is the
        same process (re-executed) and adopts its own children, which would otherwise stay zombies while it runs."""
        try:
            if self._proc.ppid() == os.getpid():
                os.waitpid(self.pid, os.WNOHANG)
        except (*_SKIP, ChildProcessError, ProcessLookupError):
            pass

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the engine's group; False when the engine is gone (then nothing is sent)."""
        # is_running() is the identity check (pid and start time); a zombie
        # still passes it, and rightly: its pid is not free for reuse until reaped.
        if not self._proc.is_running():
            return False
        try:
            if self._group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    async def wait(self, *, interval_s: float) -> None:
        """Return once the engine has exited, checking every ``interval_s``."""
        # Polled, because there is nothing to wait on: it is not our child, so no waitpid.
        while self.alive():  # noqa: ASYNC110
            await asyncio.sleep(interval_s)

    def sweep(self) -> None:
        """SIGKILL what is left of the group once the leader is gone (workers hold GPU memory)."""
        if self._group:
            # The kernel keeps the id reserved while any member of the group
            # lives, so a group found here is still the engine's.
            ending.sweep_group(self.pid)

    async def terminate(self, *, grace_s: float, interval_s: float = 0.1) -> bool:
        """SIGTERM the group, SIGKILL it after ``grace_s``; True when it had to be killed.

        Returns once the engine is gone; as for our own children, the wait after
        SIGKILL is the caller's to bound.
        """
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait(interval_s=interval_s), grace_s)
            killed = False
        except TimeoutError:
            # SIGKILL ends a stopped (SIGSTOP, or traced) process too, where the
            # SIGTERM stayed pending: an engine frozen that way gets here.
            killed = self.signal(signal.SIGKILL)
            await self.wait(interval_s=interval_s)
        self.sweep()
        return killed
