"""Where on this node a ``file:`` source may point: under the source roots, decided before anything is opened.

A model's ``spec.source`` is written by an operator, and the agent that opens it runs as root. Before this
check, ``file:///etc/shadow``, the control plane's ``ca.key`` and ``/proc/self/environ`` were accepted: the
agent stat'ed and opened them, an engine read their first bytes and printed them in its error, and the
shard's status carried both to every viewer. So a file source is resolved here, once, to its real path
(symlinks and ``..`` followed, as the kernel will follow them when the engine opens it) and refused unless
that lies under one of the node's source roots: its weights directories (``model_dirs``, the weights
cache) and the extra directories an administrator names in ``source_roots``. The refusal comes before any
byte is read and names the path as the operator wrote it, never anything found there.

``pkg:`` sources are not paths: they resolve through the installed distributions' records
(``weights._resolve_package``), and what is installed is the node administrator's choice.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from llmgw.core import errors

SETTING = "source_roots in the agent's settings"


@dataclasses.dataclass(frozen=True, slots=True)
class Roots:
    """The directories a file source must lie under, as configured (their real paths are taken at each check)."""

    dirs: tuple[Path, ...]

    @classmethod
    def of(cls, *groups: Iterable[Path]) -> Roots:
        """The roots from several settings (the weights directories, then ``source_roots``), each once."""
        return cls(tuple(dict.fromkeys(Path(d) for g in groups for d in g)))

    def describe(self) -> str:
        return ", ".join(str(d) for d in self.dirs) or "none"

    def check(self, path: str, *, source: str) -> str:
        """``path`` when its real path lies under a root; EngineError naming the setting otherwise.

        Nothing is opened: ``realpath`` only reads directory entries and links, and a path that does not
        exist resolves as far as it does, so a missing file inside a root still gets the caller's "does not
        exist" and one outside gets this refusal, whichever it is.
        """
        real = os.path.realpath(path)
        for d in self.dirs:
            root = os.path.realpath(d)
            if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
                return path
        raise errors.EngineError(f"spec.source {source.removeprefix('file://')} is outside this node's source "
                                 f"roots ({self.describe()}); put the weights under one, or add a root to "
                                 f"{SETTING}")
