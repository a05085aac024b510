"""How a shard's process ends: signals to its group, and the words for its exit.

Signals go to the process group the supervisor created (pgid == pid, from
``start_new_session``) and only while our child is unreaped, so a pid that
was reused after the engine exited is never signalled. After the leader exits
the rest of its group is killed too: vLLM and SGLang fork workers, and a
worker left behind holds GPU memory that placement would hand out again.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from pathlib import Path

#: How many lines of its output a failed shard's status carries.
TAIL_LINES = 20
# Enough for 20 long lines; a log of gigabytes is never read whole.
_TAIL_BYTES = 64 * 1024


def signal_group(proc: asyncio.subprocess.Process, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group of our still-running child; False if it had already exited."""
    if proc.returncode is not None:
        return False
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def sweep_group(pgid: int) -> None:
    """SIGKILL whatever is left of a group whose leader we have just reaped.

    Safe right after the reap: Linux does not hand out a pid that is still in
    use as a process group id, so while any member remains the id is ours.
    """
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int | None) -> str:
    """``"exited with code 1"`` or ``"was killed by signal 9 (SIGKILL)"``."""
    if code is None:
        return "has not exited"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def tail(path: Path | None, offset: int, *, lines: int = TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` non-empty lines written to ``path`` after ``offset``.

    A bounded read of a local file, so it is done on the event loop.
    """
    if path is None:
        return ()
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - _TAIL_BYTES))
            data = f.read()
    except OSError:
        return ()
    text = data.decode("utf-8", errors="replace")
    kept = collections.deque((ln.rstrip() for ln in text.splitlines() if ln.strip()), maxlen=lines)
    return tuple(kept)


async def terminate(proc: asyncio.subprocess.Process, *, grace_s: float) -> tuple[int, bool]:
    """SIGTERM the group, SIGKILL it after ``grace_s``; returns (exit code, whether it was killed).

    The wait after SIGKILL is unbounded: a process in uninterruptible sleep (a
    GPU driver fault) exits only when the kernel lets it, and the caller bounds
    how long it waits for that.
    """
    signal_group(proc, signal.SIGTERM)
    killed = False
    try:
        code = await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        killed = signal_group(proc, signal.SIGKILL)
        code = await proc.wait()
    sweep_group(proc.pid)
    return code, killed
