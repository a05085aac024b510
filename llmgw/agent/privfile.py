"""Writing a small file of the agent's state atomically, readable by its owner only."""

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
