"""Before an engine of another user starts: can that user reach everything it must?

An engine that cannot read its interpreter, llmgw, its model or its work dir
dies with "Permission denied" in a log nobody reads, or worse, half-loads. So
``preflight`` walks each path the engine must reach as the kernel will for the
engine's uid and groups (every directory searchable, symlinks followed through
both their directories, the file readable or executable, every file under a
model directory readable, the GPUs' device files read-write when it is given
GPUs) and refuses the shard before launch with the path and the directory
that blocks it, and what to do: ``/root is 0700`` is the usual one (pyenv's
Python, a checkout under /root). Modes only: a POSIX ACL that grants more is
not read, so a path only an ACL opens is refused (grant it by mode instead).
"""

from __future__ import annotations

import collections
import grp
import os
import pwd
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from llmgw.agent.supervisor.identity import EngineUser
from llmgw.core.errors import EngineError

#: Symlinks followed in one path before the walk gives up (the kernel's limit is 40).
_MAX_LINKS = 40
#: Files looked at under a model directory before the walk stops checking (a checkpoint has tens).
_MAX_FILES = 10_000
_R, _W, _X = 4, 2, 1

Gids = int | Collection[int]


def _allows(st: os.stat_result, uid: int, gid: Gids, bits: int) -> bool:
    """Whether the mode grants ``bits`` to ``uid`` in groups ``gid``, as the kernel decides (ACLs aside)."""
    gids = {gid} if isinstance(gid, int) else set(gid)
    if st.st_uid == uid:
        granted = (st.st_mode >> 6) & 7
    elif st.st_gid in gids:
        granted = (st.st_mode >> 3) & 7
    else:
        granted = st.st_mode & 7
    return granted & bits == bits


def _owner(st: os.stat_result) -> str:
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return str(st.st_uid)


def _says(path: str, st: os.stat_result) -> str:
    return f"{path} is {stat.S_IMODE(st.st_mode):04o} (owner {_owner(st)})"


def reach(path: str, uid: int, gid: Gids) -> tuple[str, os.stat_result | None, str]:
    """Follow ``path`` as ``uid``/``gid`` would: (the real path, its stat or None when it is missing, "") when every
    directory on the way may be searched, else (the path asked, None, why not: the directory that blocks it).

    Symlinks are followed as the kernel follows them: the directories of the
    link and of its target must both be searchable.
    """
    parts = collections.deque(Path(path).parts[1:])
    cur = "/"
    links = 0
    while parts:
        name = parts.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        st_dir = os.stat(cur)
        if not _allows(st_dir, uid, gid, _X):
            return path, None, _says(cur, st_dir)
        nxt = os.path.join(cur, name)
        try:
            lst = os.lstat(nxt)
        except FileNotFoundError:
            return nxt, None, ""
        if stat.S_ISLNK(lst.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return nxt, None, ""  # a loop: the launch fails with its own ELOOP
            target = os.readlink(nxt)
            if target.startswith("/"):
                cur = "/"
            parts.extendleft(reversed(Path(target).parts[1 if target.startswith("/") else 0:]))
            continue
        cur = nxt
    return cur, os.stat(cur), ""


def blocked(path: str, uid: int, gid: Gids, *, run: bool = False) -> str | None:
    """Why ``uid``/``gid`` cannot read (``run``: execute) ``path``, in words; None when it can, or it is missing.

    A directory must be listable and every file under it readable (a model
    directory: its config and every shard of its weights).
    """
    real, st, why = reach(path, uid, gid)
    if why:
        return why
    if st is None:
        return None  # missing: the launch says so in its own words
    shown = path if real == path else f"{path} (that is {real})"
    if stat.S_ISDIR(st.st_mode):
        if not _allows(st, uid, gid, _R | _X):
            return _says(shown, st)
        return _blocked_under(real, uid, gid)
    if run and not _allows(st, uid, gid, _X):
        return _says(shown, st)
    if not run and not _allows(st, uid, gid, _R):
        return _says(shown, st)
    return None


def _blocked_under(top: str, uid: int, gid: Gids) -> str | None:
    seen = 0
    for root, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            seen += 1
            if seen > _MAX_FILES:
                return None
            full = os.path.join(root, name)
            try:
                st = os.stat(full)
            except OSError:
                continue  # a dangling link: not the engine's to read
            want = _R | _X if stat.S_ISDIR(st.st_mode) else _R
            if not _allows(st, uid, gid, want):
                return _says(full, st)
    return None


def paths_of(argv: list[str], model_path: str | None, env: Mapping[str, str]) -> list[tuple[str, bool]]:
    """(path, must run) for what an engine started with ``argv`` must reach: its program, every absolute path
    among its arguments that exists, its model, and llmgw itself when the agent's Python runs one of its modules."""
    found: list[tuple[str, bool]] = []
    program = argv[0]
    if not os.path.isabs(program):
        program = _which(program, env.get("PATH", "")) or program
    if os.path.isabs(program):
        found.append((program, True))
    for arg in argv[1:]:
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        if os.path.isabs(value) and os.path.exists(value):
            found.append((value, False))
    if model_path and os.path.isabs(model_path):
        found.append((model_path, False))
    if len(argv) > 2 and argv[1] == "-m" and argv[2].startswith("llmgw."):
        # The agent's own package, which the engine imports: an editable install lives wherever the checkout is.
        import llmgw

        found.append((os.path.dirname(os.path.abspath(llmgw.__file__)), False))
    return list(dict.fromkeys(found))


def _which(name: str, path: str) -> str | None:
    for d in path.split(os.pathsep):
        full = os.path.join(d, name)
        if d and os.path.isfile(full):
            return full
    return None


def preflight(user: EngineUser, argv: list[str], *, model_path: str | None, env: Mapping[str, str],
              shard_id: str, work_dir: Path | None = None) -> None:
    """EngineError naming the path and what blocks it when ``user`` cannot run this engine (blocking: a path walk).

    The work dir is checked too: it is the engine's, but the run dir above it must be searchable.
    """
    wanted = paths_of(argv, model_path, env) + ([(str(work_dir), False)] if work_dir is not None else [])
    for path, run in wanted:
        why = blocked(path, user.uid, user.gids, run=run)
        if why is not None:
            verb = "run" if run else "read"
            raise EngineError(f"shard {shard_id}: its engine runs as uid {user.uid} (engine_user), which cannot "
                              f"{verb} {path}: {why}; make it reachable by other users (every directory above it "
                              "o+x, the file o+r; e.g. install llmgw and its venv outside /root), or set engine_user "
                              "to a user that can reach it")
    if env.get("CUDA_VISIBLE_DEVICES"):
        why = gpu_blocked(user)
        if why is not None:
            raise EngineError(f"shard {shard_id}: its engine runs as uid {user.uid} (engine_user), which cannot open "
                              f"the GPUs: {why}; make the NVIDIA device files 0666 (the driver's default, "
                              "NVreg_DeviceFileMode=0666), or set engine_user to a user in their group")


#: The device files a CUDA process opens (the per-GPU ones are globbed: /dev/nvidia0, /dev/nvidia1, ...).
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def gpu_blocked(user: EngineUser, dev: Path = Path("/dev")) -> str | None:
    """Why ``user`` cannot open the NVIDIA device files read-write, in words; None when it can (or there are none)."""
    paths = [dev / Path(p).name for p in GPU_DEVICES] + sorted(dev.glob("nvidia[0-9]*"))
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not _allows(st, user.uid, user.gids, _R | _W):
            try:
                group = grp.getgrgid(st.st_gid).gr_name
            except KeyError:
                group = str(st.st_gid)
            return f"{path} is {stat.S_IMODE(st.st_mode):04o} (owner {_owner(st)}, group {group})"
    return None
