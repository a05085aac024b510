"""The one place where text from a request becomes a path under the mirror's directory.

Every route builds its filesystem paths through ``inside`` and ``segment``: a repo name, a revision, a
file path inside a repo. Anything that could leave the directory is refused here, so no handler can
forget to check: ``..`` or ``.`` segments, an absolute path, a backslash or NUL, and a symlink whose
target lies outside (a hand-made ``weights -> /etc`` link would otherwise serve the host's files).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# An org, a repo, a branch or a mirror:// name: one segment, as the Hub allows them.
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


class PathRefused(Exception):
    """A path from a request that the mirror will not serve; ``status`` is 400 (malformed) or 404 (outside)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(message)


def segment(text: str, what: str) -> str:
    """``text`` when it is one safe path segment (letters, digits, ``._-``), else PathRefused(400)."""
    if not _SEGMENT.fullmatch(text) or text.endswith(".") or ".." in text:
        raise PathRefused(400, f"{what} {text!r} is not a name the mirror serves: use letters, digits, '.', '_' "
                               "and '-', starting with a letter or digit")
    return text


def relative(text: str, what: str = "path") -> str:
    """``text`` when it is a relative path of plain segments, else PathRefused(400) saying what was wrong."""
    if not text:
        raise PathRefused(400, f"the {what} is empty: name a file, e.g. config.json")
    if "\x00" in text or "\\" in text:
        raise PathRefused(400, f"the {what} {text!r} has a NUL or a backslash: use '/' between segments")
    if text.startswith("/"):
        raise PathRefused(400, f"the {what} {text!r} is absolute: give it relative to the repository or name")
    if any(part in ("", ".", "..") for part in text.split("/")):
        raise PathRefused(400, f"the {what} {text!r} has an empty, '.' or '..' segment: the mirror serves only "
                               "paths inside its directory")
    return text


def inside(root: Path, rel: str, *, what: str = "path") -> Path:
    """``root/rel`` with symlinks resolved, refused unless it stays under ``root`` (which must exist)."""
    relative(rel, what)
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, rel))
    if real != real_root and not real.startswith(real_root + os.sep):
        raise PathRefused(404, f"the {what} {rel!r} leads outside the mirror's directory (a symlink out of it); "
                               "the mirror serves only files inside it")
    return Path(real)
