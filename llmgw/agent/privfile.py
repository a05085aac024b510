"""Writing a small file of the agent's state atomically, readable by its owner only; making its directories.

Engines run as other users (``supervisor.identity``), so the modes of what the agent makes are its
boundary: its key, certificates and state files are 0600 in directories engines cannot list, and the
directories an engine must pass through on the way to its work dir, its weights or its venv are 0711
or 0755. Only directories llmgw creates get a mode from here; one that already exists is the
operator's and is left as it is.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` with mode 0600 through ``.NAME.PID.tmp`` beside it; OSError when the disk refuses.

    O_EXCL with the mode given at creation: a file created and then chmod'ed would be readable by everyone for
    the moment in between, and a planted file or symlink is refused, not written through. A reader sees the
    old file or the new one, never half.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)  # left by a write that was interrupted in this same process
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def make_dir(path: Path, mode: int) -> bool:
    """Create ``path`` with exactly ``mode`` (the umask cannot take more) when it is missing; True when made.

    Missing parents are made 0755: they are on the way to it. An existing
    directory keeps its mode: it is not llmgw's to change.
    """
    if path.is_dir():
        return False
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        if path.is_dir():
            return False  # made by another thread or agent a moment ago
        raise
    os.chmod(path, mode)
    return True
