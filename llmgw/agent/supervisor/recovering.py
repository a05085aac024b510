"""What to do with the engines a previous agent left behind: adopt, forget or kill.

``look`` reads the state files and surveys the process table (blocking: the
supervisor runs it in a thread); ``decide`` is pure: what ``look`` found in,
a list of decisions out, and the supervisor carries them out. Its rules:

* A state file whose process still runs, with the same identity (the marker
  in its environment, or its start time where that cannot be read), is
  **adopted**: the engine keeps serving and the new agent reports it.
* A state file whose pid is gone, or now belongs to another process (the pid
  was reused), is **forgotten**: the file is removed, and nothing is
  signalled, because the process with that pid now is not ours.
* A live process whose environment names this run dir but that no adopted
  state file describes is **killed** (with the group it leads): nothing can
  describe it to the control plane, whose placement would then hand its GPUs
  and port out again, and the next engine there would fail or run out of
  memory. That is a crashed agent's engine whose state file is missing or
  unreadable, and a worker left by an engine that has died.

The work dir (``<shard_id>.d``) of a shard forgotten or killed goes too
(``ended_work_dirs``): its engine is gone, and an adopted shard's stays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from llmgw.agent.supervisor import launching, orphans, statefiles
from llmgw.core import shards
from llmgw.core.errors import ShardIdError


@dataclasses.dataclass(frozen=True, slots=True)
class Adopt:
    saved: statefiles.Saved
    seen: orphans.Seen
    #: Anything odd about the match, for the log ("" when there is nothing to say).
    note: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Forget:
    path: Path
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Kill:
    seen: orphans.Seen
    reason: str


Decision = Adopt | Forget | Kill
Files = Sequence[tuple[Path, statefiles.Saved | statefiles.Unreadable]]


def look(run_dir: Path, *, ours: Callable[[int], bool] | None = None) -> tuple[Files, orphans.Survey]:
    """Every state file in ``run_dir`` (read, or why not) and one survey of the processes they and the markers name.

    ``ours``: the uids this agent's engines may run as (``identity.Policy.may_be_engine``); None: its own.
    """
    files: list[tuple[Path, statefiles.Saved | statefiles.Unreadable]] = []
    for path in statefiles.listing(run_dir):
        try:
            files.append((path, statefiles.read(path)))
        except statefiles.Unreadable as exc:
            files.append((path, exc))
    pids = [saved.pid for _, saved in files if isinstance(saved, statefiles.Saved)]
    return files, orphans.survey(str(run_dir), pids, ours=ours)


def identify(saved: statefiles.Saved, seen: orphans.Seen | None, *, run_dir: str) -> str | None:
    """None when ``seen`` is the engine ``saved`` describes; otherwise why it is not."""
    if seen is None:
        return f"its engine (pid {saved.pid}) is no longer running"
    if seen.environ_read:
        if seen.shard_id == saved.shard_id and seen.run_dir == run_dir:
            return None
        return (f"pid {saved.pid} now belongs to another process (its environment does not name "
                f"shard {saved.shard_id}): the engine exited and the pid was reused")
    if abs(seen.create_time - saved.create_time) <= orphans.START_TIME_SLACK_S:
        return None
    return (f"pid {saved.pid} now belongs to a process started {seen.create_time - saved.create_time:+.1f} s "
            "from the engine: the engine exited and the pid was reused")


def _note(saved: statefiles.Saved, seen: orphans.Seen) -> str:
    drift = seen.create_time - saved.create_time
    if abs(drift) <= orphans.START_TIME_SLACK_S:
        return ""
    return (f"its start time reads {drift:+.1f} s from the state file's, but its environment names this "
            "shard: the system clock was stepped since it started")


def decide(files: Files, found: orphans.Survey, *, run_dir: str, keep: Collection[int] = (),
           known: Collection[str] = ()) -> list[Decision]:
    """The decisions for one recovery; ``keep`` are pids and ``known`` shard ids this agent already runs."""
    decisions: list[Decision] = []
    adopted: set[str] = set()
    why_not: dict[str, str] = {}  # shard id -> why its processes are not adopted
    for path, saved in files:
        shard_id = path.name.removesuffix(statefiles.SUFFIX)
        if shard_id in known:
            continue
        if isinstance(saved, statefiles.Unreadable):
            why_not[shard_id] = f"its state file is unreadable ({saved})"
            decisions.append(Forget(path, str(saved)))
            continue
        seen = found.by_pid.get(saved.pid)
        problem = identify(saved, seen, run_dir=run_dir)
        if problem is None and seen is not None:
            adopted.add(shard_id)
            decisions.append(Adopt(saved, seen, _note(saved, seen)))
        else:
            why_not[shard_id] = f"shard {shard_id}'s {problem}"
            decisions.append(Forget(path, problem or "its engine is gone"))
    for seen in found.marked:
        if seen.pid in keep or seen.shard_id in known or seen.shard_id in adopted:
            # An adopted engine's workers carry its marker too: they are part of it.
            continue
        if seen.shard_id is None:
            reason = f"it carries {launching.RUN_DIR_ENV} of this agent but no {launching.SHARD_ENV}"
        else:
            reason = why_not.get(seen.shard_id, f"shard {seen.shard_id} has no state file")
        decisions.append(Kill(seen, reason))
    return decisions


def ended_work_dirs(decisions: Sequence[Decision], *, run_dir: Path) -> list[Path]:
    """The work dirs of the shards ``decisions`` forget or kill, none of an adopted one; each once."""
    adopted = {d.saved.shard_id for d in decisions if isinstance(d, Adopt)}
    ids: dict[str, None] = {}
    for d in decisions:
        if isinstance(d, Forget):
            ids[d.path.name.removesuffix(statefiles.SUFFIX)] = None
        elif isinstance(d, Kill) and d.seen.shard_id is not None:
            ids[d.seen.shard_id] = None
    found = []
    for shard_id in ids:
        if shard_id in adopted:
            continue
        try:
            shards.check_shard_id(shard_id)
        except ShardIdError:
            continue  # a name put there by hand, or a marker set by hand: no dir of ours to remove
        found.append(launching.work_dir_of(run_dir, shard_id))
    return found
