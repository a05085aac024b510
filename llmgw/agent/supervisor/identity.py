"""Who an engine runs as: never root, and, when the agent is root, a uid of its own per shard.

An engine runs whatever its model spec and its weights make it run: a vLLM
``--trust-remote-code`` repository, an OpenSSL config a model's env names, a
pickle in a checkpoint. As root that is the node. So the agent starts each
engine as an unprivileged user (``engine_user``):

* ``auto`` (the default), agent running as root: every shard gets a uid of its
  own from ``engine_uids`` (600000-609999 by default; no /etc/passwd entry is
  needed, the gid is the same number). Separate uids are what keep one engine
  from reading another's API key, in its environment (/proc/PID/environ is
  readable by the same uid) or in its key file, and from signalling or tracing it.
  The uid is kept in the shard's state file, so an adopted engine keeps it.
* a user name: that user for every shard. Weaker: engines can read each other's
  keys. For nodes whose policy wants engines under one named account.
* ``agent``, or any setting when the agent is not root: the agent's own user
  (there is nothing to switch to). ``agent`` as root would be root, and is refused.

A setting that resolves to uid 0 is refused, always. What the engine can
read is the rest: ``preflight`` checks it before launch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pwd
from collections.abc import Callable, Collection
from pathlib import Path

from llmgw.core.errors import EngineError, LlmgwError

AUTO = "auto"
AGENT = "agent"
#: 600000-609999: above the ranges distributions hand out (system < 1000, users < 60000, systemd's
#: DynamicUser 61184-65519), and above the first seven 65536-uid blocks of /etc/subuid (from 100000).
DEFAULT_UIDS = (600000, 609999)
#: What USER and LOGNAME say for a uid with no /etc/passwd entry (getpass.getuser() reads them first).
NAME_PREFIX = "llmgw-shard-"


@dataclasses.dataclass(frozen=True, slots=True)
class EngineUser:
    """The uid and gid an engine runs as, its supplementary groups, and the name it is told it has.

    A uid from the range has no groups; a named user keeps its own (the group that may open the GPUs,
    say), never group 0.
    """

    uid: int
    gid: int
    name: str
    groups: tuple[int, ...] = ()

    @property
    def gids(self) -> tuple[int, ...]:
        return (self.gid, *self.groups)


def parse_uids(text: str) -> tuple[int, int]:
    """``"600000-609999"`` -> (600000, 609999); ValueError saying what is wrong."""
    lo_s, sep, hi_s = text.strip().partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        raise ValueError(f"expected a range of uids such as 600000-609999, got {text!r}") from None
    if not sep or lo < 1 or hi < lo or hi >= 2**32 - 1:
        raise ValueError(f"expected a range of uids LOW-HIGH with 0 < LOW <= HIGH < 4294967295, got {text!r} "
                         "(uid 0 is root, which engines never run as)")
    return lo, hi


def pick_uid(lo: int, hi: int, used: Collection[int], shard_id: str) -> int | None:
    """A uid in ``lo..hi`` not in ``used``, starting at a place the shard id chooses; None when all are used.

    Starting where the id hashes to spreads shards over the range, so a uid freed
    a moment ago (whose files in /dev/shm or /tmp may still be there) is rarely
    the next one given; shard ids are never reused.
    """
    size = hi - lo + 1
    start = int.from_bytes(hashlib.sha256(shard_id.encode()).digest()[:8], "big") % size
    for i in range(size):
        uid = lo + (start + i) % size
        if uid not in used:
            return uid
    return None


def running_uids(proc: Path = Path("/proc")) -> set[int]:
    """The effective uids of every process now (the owner of /proc/PID); a small /proc listing."""
    found = set()
    try:
        names = os.listdir(proc)
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            try:
                found.add(os.stat(proc / name).st_uid)
            except OSError:
                continue  # exited while we looked
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """Who this agent's engines run as: ``mode`` is "own" (the agent's user), "user" (one named) or "range"."""

    mode: str
    #: "own" and "user": the one user (None for "own": nothing is switched).
    user: EngineUser | None = None
    uids: tuple[int, int] = DEFAULT_UIDS

    @property
    def switches(self) -> bool:
        return self.mode != "own"

    def may_be_engine(self, uid: int, own_uid: int) -> bool:
        """Whether a process of ``uid`` may be one of this agent's engines (the recovery's survey)."""
        if uid == own_uid:
            return True
        if self.mode == "user":
            return self.user is not None and uid == self.user.uid
        if self.mode == "range":
            return self.uids[0] <= uid <= self.uids[1]
        return False

    def describe(self) -> str:
        if self.mode == "range":
            return (f"engines run as a uid of their own per shard, from {self.uids[0]}-{self.uids[1]} "
                    "(engine_user auto, engine_uids)")
        if self.mode == "user":
            assert self.user is not None
            return (f"engines run as user {self.user.name} (uid {self.user.uid}, gid {self.user.gid}); they can "
                    "read each other's API keys: engine_user auto gives each shard a uid of its own")
        return "the agent is not root: engines run as the agent's own user (nothing to switch to)"


OWN = Policy("own")


def resolve(setting: str, uids: tuple[int, int] = DEFAULT_UIDS, *, euid: int | None = None,
            getpwnam: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
            getgrouplist: Callable[[str, int], list[int]] = os.getgrouplist) -> Policy:
    """The policy ``engine_user`` names on this node; LlmgwError, saying what to change, when it cannot be used."""
    euid = os.geteuid() if euid is None else euid
    setting = setting.strip()
    if uids[0] <= 0:
        raise LlmgwError(f"engine_uids {uids[0]}-{uids[1]} includes uid 0 (root), which engines never run as; "
                         "set engine_uids to a range above 0, such as 600000-609999")
    if euid != 0:
        return OWN  # nothing to switch to; "agent" and a name alike (a name would need root to switch)
    if setting == AGENT:
        raise LlmgwError("engine_user is agent and the agent runs as root: engines never run as root; set "
                         "engine_user to auto (a uid of its own per shard) or to an unprivileged user's name")
    if setting == AUTO:
        return Policy("range", uids=uids)
    try:
        entry = getpwnam(setting)
    except KeyError:
        raise LlmgwError(f"engine_user {setting!r}: no such user on this node; create it (useradd --system "
                         f"--no-create-home {setting}) or set engine_user to auto") from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise LlmgwError(f"engine_user {setting!r} is uid {entry.pw_uid}, gid {entry.pw_gid}: engines never run as "
                         "root or group root; name an unprivileged user, or set engine_user to auto")
    groups = tuple(g for g in getgrouplist(entry.pw_name, entry.pw_gid) if g not in (0, entry.pw_gid))
    return Policy("user", user=EngineUser(entry.pw_uid, entry.pw_gid, entry.pw_name, groups))


class Users:
    """Hands out engine users to shards: no two live shards share a uid from the range."""

    def __init__(self, policy: Policy = OWN, *, running: Callable[[], set[int]] = running_uids) -> None:
        self.policy = policy
        self._running = running
        self._taken: dict[str, int] = {}

    def take(self, shard_id: str, *, live: Collection[str]) -> EngineUser | None:
        """The user ``shard_id``'s engine runs as (None: the agent's own); EngineError when none is free.

        ``live`` are the shards whose process may still run: the uids of any
        other shard are free again. A uid some process has now (a worker that
        outlived its engine, another agent's engine) is not handed out either.
        """
        if self.policy.mode != "range":
            return self.policy.user
        self._taken = {s: u for s, u in self._taken.items() if s in live and s != shard_id}
        lo, hi = self.policy.uids
        uid = pick_uid(lo, hi, set(self._taken.values()) | self._running(), shard_id)
        if uid is None:
            raise EngineError(f"shard {shard_id}: every uid of engine_uids {lo}-{hi} is in use by an engine or "
                              "another process; widen engine_uids in the agent's settings")
        self._taken[shard_id] = uid
        return EngineUser(uid, uid, f"{NAME_PREFIX}{uid}")

    def keep(self, shard_id: str, uid: int | None, gid: int | None) -> EngineUser | None:
        """An adopted shard's user, as its state file recorded it; its uid stays taken while it lives."""
        if uid is None:
            return None
        if self.policy.mode == "range" and self.policy.uids[0] <= uid <= self.policy.uids[1]:
            self._taken[shard_id] = uid
        if self.policy.user is not None and self.policy.user.uid == uid:
            return self.policy.user
        return EngineUser(uid, uid if gid is None else gid, f"{NAME_PREFIX}{uid}")


def identity_env(user: EngineUser, work_dir: Path) -> dict[str, str]:
    """The variables that say who the engine is and where its home is: its work dir.

    Libraries ask ``getpass.getuser()`` (USER and LOGNAME first) and cache under
    HOME (torch, triton, huggingface): left as the agent's, they name root and
    /root, which the engine can neither be nor write.
    """
    return {"HOME": str(work_dir), "USER": user.name, "LOGNAME": user.name, "PWD": str(work_dir)}


#: The agent's own variables that point into its home or session, dropped for an engine of another user.
AGENT_ONLY_ENV = ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
                  "MAIL", "OLDPWD")


def give_tree(path: Path, user: EngineUser) -> None:
    """Make ``path`` (a work dir llmgw just made) and everything in it the engine's; never through a symlink."""
    os.chown(path, user.uid, user.gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.chown(os.path.join(root, name), user.uid, user.gid, follow_symlinks=False)
