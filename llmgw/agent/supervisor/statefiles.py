"""One file per running shard, so that an agent started later can take its engine back.

Engines outlive the agent on purpose (the router talks to them directly, so an
agent restart must not interrupt served traffic), and a new agent can only
adopt what it can describe: ``<run_dir>/<shard_id>.json`` holds the whole spec,
the pid and the process's start time (which tells the engine from a process
that was later given the same pid), its port, endpoint, host, argv and log,
and whether it serves HTTP (a worker rank does not: an agent that adopted one
and probed it would give it up as unanswering), and the uid and gid it runs as
(``identity``: an adopted engine keeps its uid, and no new shard is given it
while it lives).

It is written right after the launch and removed when the shard ends, so a
file means "this agent believes the process runs". Writes are a temporary file
and ``os.replace``: an agent killed mid-write leaves the old file or the new
one, never half of one, and a half-written file would get a healthy engine
killed as unidentifiable. Mode 0600, because the spec carries the engine's API
key. There is no fsync: the file describes processes, and none survives the
power loss that an fsync would guard against.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from llmgw.agent import privfile
from llmgw.core import shards
from llmgw.core.adapters import Adapter
from llmgw.core.errors import ShardIdError
from llmgw.core.shards import ShardSpec

log = logging.getLogger(__name__)

#: Bumped when a field changes meaning; a file of another version is unreadable.
VERSION = 1
SUFFIX = ".json"
_TMP_PREFIX = "."
_SPEC_FIELDS = {f.name for f in dataclasses.fields(ShardSpec)}


class Unreadable(Exception):
    """A state file that exists but cannot describe its shard; the message says why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Saved:
    """What a state file says about one shard's process."""

    spec: ShardSpec
    pid: int
    #: ``psutil.Process.create_time()``: seconds since the epoch, as the kernel's start time.
    create_time: float
    port: int
    endpoint: str
    host: str
    log_path: Path
    #: Where this run's output starts in the log (earlier runs under the id appended before it).
    log_offset: int = 0
    argv: tuple[str, ...] = ()
    #: False for a worker rank that answers no HTTP (absent in an older agent's file: every engine did).
    serves_http: bool = True
    #: The uid and gid it runs as; None: the agent's own (and in an older agent's file).
    uid: int | None = None
    gid: int | None = None

    @property
    def shard_id(self) -> str:
        return self.spec.shard_id


def path_of(run_dir: Path, shard_id: str) -> Path:
    """Where ``shard_id``'s state file is; ShardIdError for an id that would name a file outside ``run_dir``."""
    return run_dir / f"{shards.check_shard_id(shard_id)}{SUFFIX}"


def _to_json(saved: Saved) -> dict[str, Any]:
    spec = dataclasses.asdict(saved.spec)
    spec["args"] = list(saved.spec.args)
    spec["env"] = [list(kv) for kv in saved.spec.env]
    return {"version": VERSION, "shard_id": saved.shard_id, "spec": spec, "pid": saved.pid,
            "create_time": saved.create_time, "port": saved.port, "endpoint": saved.endpoint,
            "host": saved.host, "log_path": str(saved.log_path), "log_offset": saved.log_offset,
            "argv": list(saved.argv), "serves_http": saved.serves_http, "uid": saved.uid, "gid": saved.gid,
            "written_at": time.time()}


def write(run_dir: Path, saved: Saved) -> Path:
    """Write ``saved`` atomically with mode 0600; OSError when the disk refuses."""
    path = path_of(run_dir, saved.shard_id)
    # The temporary name starts with _TMP_PREFIX ("."), which ``scan`` skips and cleans.
    privfile.write_atomic(path, json.dumps(_to_json(saved), indent=1).encode())
    return path


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"serves_http is {value!r}, not true or false")
    return value


def _id(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"uid or gid is {value!r}, not a number")
    return value


def read(path: Path) -> Saved:
    """The shard ``path`` describes; Unreadable with the reason otherwise."""
    try:
        raw = json.loads(path.read_bytes())
    except OSError as exc:
        raise Unreadable(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise Unreadable(f"{path} is not JSON ({exc})") from exc
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        version = raw.get("version") if isinstance(raw, dict) else None
        raise Unreadable(f"{path} has version {version!r}; this agent reads version {VERSION}")
    try:
        fields = raw["spec"]
        unknown = set(fields) - _SPEC_FIELDS
        if unknown:
            # Written by a newer agent: the fields known here still describe the
            # shard, which beats killing a healthy engine on a downgrade.
            log.warning("state file %s has spec fields this agent does not know (%s); ignoring them",
                        path, ", ".join(sorted(unknown)))
        known = {k: v for k, v in fields.items() if k in _SPEC_FIELDS}
        known["args"] = tuple(known.get("args", ()))
        known["env"] = tuple((str(k), str(v)) for k, v in known.get("env", ()))
        # Absent in a file an older agent wrote: that engine was given no GPUs.
        known["gpus"] = tuple(int(g) for g in known.get("gpus", ()))
        known["hcas"] = tuple(str(h) for h in known.get("hcas", ()))
        known["adapters"] = tuple(Adapter(name=str(a["name"]), source=str(a["source"]), rank=int(a.get("rank", 0)))
                                  for a in known.get("adapters", ()))
        spec = ShardSpec(**known)
        saved = Saved(spec=spec, pid=int(raw["pid"]), create_time=float(raw["create_time"]),
                      port=int(raw["port"]), endpoint=str(raw["endpoint"]), host=str(raw["host"]),
                      log_path=Path(raw["log_path"]), log_offset=int(raw.get("log_offset", 0)),
                      argv=tuple(str(a) for a in raw.get("argv", ())),
                      serves_http=_flag(raw.get("serves_http", True)), uid=_id(raw.get("uid")),
                      gid=_id(raw.get("gid")))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Unreadable(f"{path} does not describe a shard ({type(exc).__name__}: {exc})") from exc
    try:
        # A file put there by hand: its id would become the log's path when it is adopted.
        shards.check_shard_id(spec.shard_id)
    except ShardIdError as exc:
        raise Unreadable(f"{path}: {exc}") from None
    if spec.shard_id != path.name.removesuffix(SUFFIX):
        raise Unreadable(f"{path} describes shard {spec.shard_id!r}, not the one its name says")
    if saved.pid <= 1:
        raise Unreadable(f"{path} names pid {saved.pid}, which no engine has")
    return saved


def listing(run_dir: Path) -> list[Path]:
    """Every state file in ``run_dir``, in name order; leftover temporaries are removed."""
    try:
        entries = sorted(run_dir.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(_TMP_PREFIX) and entry.name.endswith(".tmp"):
            # An agent killed between write and replace; the real file is intact.
            entry.unlink(missing_ok=True)
        elif entry.suffix == SUFFIX and entry.is_file():
            found.append(entry)
    return found


def remove(path: Path | None) -> None:
    """Delete a state file; a failure is logged, since the shard has ended either way."""
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        # Left behind, it names a dead pid: the next agent checks the start time and removes it.
        log.warning("cannot remove state file %s: %s", path, exc.strerror or exc)
