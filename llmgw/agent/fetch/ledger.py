"""The record of what llmgw fetched into a weights cache: ``<cache>/.llmgw-fetched.json``.

It is the only authority ``remove`` trusts. The control plane may ask to remove anything (a bug, an
old state, a person's typo); the agent deletes a name only when it is one llmgw makes (``Source.cache_name``'s
alphabet, one path element), it is written here as fetched by llmgw, and on disk it is a real directory
directly inside the cache, not a symlink. A directory a person copied in by hand, a path with ``..``, an
absolute path or a symlink pointing out of the cache are refused and logged, and left as they are.

The file is rewritten atomically (write a temporary file, fsync, rename): a crash mid-write must not lose
the record of 100 GB of weights, which would make them undeletable by llmgw.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from llmgw.agent.fetch import records
from llmgw.core import errors, sources

log = logging.getLogger(__name__)

FILE = ".llmgw-fetched.json"
_OURS = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class Ledger:
    """What llmgw fetched into ``cache_dir``, read from and written to its record file."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.path = cache_dir / FILE
        self._entries: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # Unreadable: nothing is removable until a person looks (the weights stay where they are).
            log.error("weights record %s is unreadable (%s); nothing in the cache counts as fetched by llmgw "
                      "until it is repaired or removed", self.path, exc)
            return {}
        entries = doc.get("entries", {}) if isinstance(doc, dict) else {}
        return {k: v for k, v in entries.items() if isinstance(v, dict) and _OURS.fullmatch(k)}

    def _save(self) -> None:
        doc = {"version": 1, "entries": self._entries}
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".llmgw-fetched.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, name: str) -> dict[str, Any] | None:
        return self._entries.get(name)

    def add(self, name: str, *, source: str, rel: str, size_bytes: int, now: float) -> None:
        self._entries[name] = {"source": source, "rel": rel, "size_bytes": size_bytes, "fetched_at": now,
                               "last_used_at": now}
        self._save()

    def touch(self, name: str, *, now: float) -> None:
        if name in self._entries:
            self._entries[name]["last_used_at"] = now
            self._save()

    def drop(self, name: str) -> None:
        if self._entries.pop(name, None) is not None:
            self._save()

    def held(self) -> list[records.Held]:
        """The entries whose directory is still there, as the inventory shows them."""
        out = []
        for name, e in sorted(self._entries.items()):
            entry = self.cache_dir / name
            if entry.is_symlink() or not entry.exists():
                continue
            out.append(records.Held(name=name, source=str(e.get("source", "")),
                                    size_bytes=int(e.get("size_bytes", 0)), fetched_at=float(e.get("fetched_at", 0)),
                                    last_used_at=float(e.get("last_used_at", 0))))
        return out

    def removable(self, name: str) -> Path:
        """The entry ``name`` names, when llmgw may delete it; FetchError (logged) saying why not otherwise."""
        reason = self._refusal(name)
        if reason:
            log.warning("refused to remove weights %r: %s", name, reason)
            raise errors.FetchError(f"refused to remove {name!r}: {reason}")
        return self.cache_dir / name

    def _refusal(self, name: str) -> str:
        if not isinstance(name, str) or not name:
            return "no name given; name an entry of `llmgw get weights`"
        if name.startswith("/") or "/" in name or "\\" in name or name in (".", ".."):
            return (f"it is a path, not a name in the weights cache {self.cache_dir}; llmgw removes only "
                    "entries it fetched, named as `llmgw get weights` lists them")
        if not _OURS.fullmatch(name) or len(name) > sources.MAX_CACHE_NAME:
            return f"llmgw never makes a name like it in {self.cache_dir}; remove such a file by hand"
        if name not in self._entries:
            return (f"{self.cache_dir / name} is not recorded in {self.path} as fetched by llmgw (it was put "
                    "there some other way); llmgw leaves it alone: remove it by hand if it should go")
        path = self.cache_dir / name
        if path.is_symlink():
            return (f"{path} is a symlink (to {os.readlink(path)}), not what llmgw fetched; llmgw does not "
                    "follow it; remove the link by hand")
        if not path.exists():
            return ""   # recorded, already gone: removing it again is a no-op (commands are idempotent)
        if path.resolve().parent != self.cache_dir.resolve() or not path.is_dir():
            return f"{path} is not an entry directly inside {self.cache_dir}"
        return ""
