"""The installer: one object owns every engine install on this node (its directories, its pip runs, its probes).

Level-triggered: ``apply`` records what the control plane wants (the whole set; an install it no longer
lists is kept until a removal names it) and wakes one task, which compares that with what is installed
and does one thing at a time in a worker thread, so pip and the probes never run on the event loop and
never make a heartbeat late. Each install is ``engines_dir/<engine>-<version>-<variant>/``, a venv
holding ``.llmgw-install.json`` (written first: only a directory with it is ever removed or replaced),
``llmgw-lock.txt`` (``pip freeze``: the exact versions this variant got) and the engine.

Ready means installed and seen to run (``probe``). Every ``recheck_s`` each Ready install is probed again:
a library removed by an unrelated upgrade is found here, not by the next replica, and the install is made
again at once from a fresh venv. A failed install is tried again after ``retry_after_s`` (a minute,
doubling, capped at half an hour), or at once when the control plane names another index.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from llmgw.agent.provision import ospkg, pip, probe
from llmgw.core import provision as prov

log = logging.getLogger(__name__)

MARKER = ".llmgw-install.json"
LOCK = "llmgw-lock.txt"
RECHECK_S = 600.0
NO_INDEX = "no package index is configured: start the server with --engine-index URL"
S = prov.InstallState


@dataclasses.dataclass(slots=True)
class _Entry:
    install: prov.EngineInstall
    variant: prov.Variant | None
    failures: int = 0
    #: Left Ready by a previous agent and not yet probed by this one: reported Installing ("probing"),
    #: probed rather than installed, and never run until it has been.
    found: bool = False
    #: It was Ready once (here or for a previous agent): kept in repair even when no longer wanted.
    was_ready: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class ReadyInstall:
    """A Ready install, for the engines registry: which python runs it."""

    want: prov.EngineWant
    variant: prov.Variant
    python: Path


class Installer:
    def __init__(self, engines_dir: Path, *, profile: Callable[[], prov.NodeProfile],
                 recheck_s: float = RECHECK_S, retry_first_s: float = prov.RETRY_FIRST_S,
                 retry_max_s: float = prov.RETRY_MAX_S, clock: Callable[[], float] = time.time,
                 is_root: Callable[[], bool] = ospkg.is_root,
                 in_use: Callable[[Path], list[str]] = lambda _p: [],
                 on_change: Callable[[], None] = lambda: None,
                 choose: Callable[[prov.EngineWant, prov.NodeProfile], prov.Variant | prov.NoVariant] =
                 prov.choose_variant, ca_bundle: Path | None = None) -> None:
        self.dir = engines_dir
        #: What pip verifies an https:// index with (``fetch.trust.bundle``: the system's and the cluster CA).
        self._ca_bundle = ca_bundle
        # The variant table (``core.provision``); injected by tests that need a variant no engine has.
        self._choose = choose
        self._profile, self._recheck_s, self._clock, self._is_root = profile, recheck_s, clock, is_root
        self._retry = (retry_first_s, retry_max_s)
        # The shards running from an install (by its path): a removal of one is refused.
        self._in_use = in_use
        self._on_change = on_change
        self._lock = threading.Lock()
        self._entries: dict[prov.EngineWant, _Entry] = {}
        self._wants: tuple[prov.EngineWant, ...] = ()
        self._source: tuple[str, bool] = ("", False)
        self._os_allowed = False
        self._removals: list[prov.EngineWant] = []
        self._changed = True
        self._wake: asyncio.Event | None = None
        #: The node as variants see it, found once (in the worker thread: it may run nvidia-smi).
        self._node: prov.NodeProfile | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what the rest of the agent reads (any thread) -------------------------------------------------------
    def installs(self) -> tuple[prov.EngineInstall, ...]:
        with self._lock:
            return tuple(e.install for _, e in sorted(self._entries.items()))

    def take_changed(self) -> tuple[prov.EngineInstall, ...] | None:
        """Every install when any changed since the last call (for a heartbeat); None when none did."""
        with self._lock:
            if not self._changed:
                return None
            self._changed = False
            return tuple(e.install for _, e in sorted(self._entries.items()))

    def sent_all(self) -> None:
        """A Register carried every install: the next heartbeat carries them only if one changes."""
        with self._lock:
            self._changed = False

    def ready(self) -> list[ReadyInstall]:
        with self._lock:
            return [ReadyInstall(w, e.variant, Path(e.install.path) / "bin" / "python")
                    for w, e in sorted(self._entries.items()) if e.install.state is S.Ready and e.variant]

    # -- what the control plane says (the event loop) --------------------------------------------------------
    def apply(self, p: prov.Provision) -> None:
        with self._lock:
            new_source = (p.index_url, p.find_links)
            if new_source != self._source:
                # Another index may have what the last one lacked: failed installs are tried again now.
                for e in self._entries.values():
                    if e.install.state is S.Failed:
                        e.install = dataclasses.replace(e.install, retry_unix=0.0)
            self._wants, self._source, self._os_allowed = tuple(p.wants), new_source, p.os_packages
            self._removals += [w for w in p.remove if w in self._entries]
        log.info("engines wanted here: %s%s", ", ".join(map(str, p.wants)) or "none",
                 f"; to remove: {', '.join(map(str, p.remove))}" if p.remove else "")
        self._poke()

    def _poke(self) -> None:
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- the loop --------------------------------------------------------------------------------------------
    async def run(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        await asyncio.to_thread(self._load)
        while True:
            self._wake.clear()
            job, wait_s = self._next()
            if job is not None:
                try:
                    await asyncio.to_thread(job)
                except Exception:
                    log.exception("an engine install step failed unexpectedly; trying again in a minute")
                    await asyncio.sleep(60)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)

    def _next(self) -> tuple[Callable[[], None] | None, float]:
        """The next step to take and, when there is none, how long until one is due (decide, then act)."""
        now = self._clock()
        with self._lock:
            if self._removals:
                want = self._removals.pop(0)
                return (lambda: self._remove(want)), 0.0
            for want in self._wants:
                if want not in self._entries:
                    self._entries[want] = self._new_entry(want)
                    self._changed = True
            due = 3600.0
            for want, e in sorted(self._entries.items()):
                i = e.install
                if e.variant is None or i.state is S.Unsupported:
                    continue
                if e.found:
                    return (lambda w=want: self._recheck(w)), 0.0
                # A failed install is tried again while it is wanted (or was once Ready: kept, so repaired); one
                # the control plane stopped asking for waits, reported Failed, instead of retrying for ever.
                wanted = want in self._wants or e.was_ready
                if i.state is S.Installing or (i.state is S.Failed and i.retry_unix <= now and wanted):
                    return (lambda w=want: self._install(w)), 0.0
                if i.state is S.Failed and wanted:
                    due = min(due, i.retry_unix - now)
                elif i.state is S.Ready:
                    if i.checked_unix + self._recheck_s <= now:
                        return (lambda w=want: self._recheck(w)), 0.0
                    due = min(due, i.checked_unix + self._recheck_s - now)
        return None, max(0.05, due)

    def _new_entry(self, want: prov.EngineWant) -> _Entry:
        chosen = self._choose(want, self._node or prov.NodeProfile())
        if isinstance(chosen, prov.NoVariant):
            log.warning("cannot install %s here: %s", want, chosen.reason)
            return _Entry(prov.EngineInstall(want.engine, want.version, "", S.Unsupported, chosen.reason), None)
        path = self.dir / prov.install_dir_name(want, chosen.name)
        return _Entry(prov.EngineInstall(want.engine, want.version, chosen.name, S.Installing, "waiting",
                                         path=str(path)), chosen)

    # -- the steps (a worker thread) -------------------------------------------------------------------------
    def _set(self, want: prov.EngineWant, **changes: object) -> prov.EngineInstall:
        with self._lock:
            e = self._entries[want]
            e.install = dataclasses.replace(e.install, **changes)  # type: ignore[arg-type]
            self._changed = True
            return e.install

    def _notify(self) -> None:
        try:
            self._on_change()
        except Exception:
            log.exception("reporting an install's change failed")

    def _install(self, want: prov.EngineWant) -> None:
        e = self._entries[want]
        assert e.variant is not None
        variant, path = e.variant, Path(e.install.path)
        index_url, find_links = self._source
        began = self._clock()
        self._set(want, state=S.Installing, message="preparing", bytes_done=0, bytes_total=0, last_output=(),
                  retry_unix=0.0)
        try:
            if not index_url:
                raise pip.Failed(NO_INDEX, ())
            self._fresh_dir(want, variant, path)
            self._os_packages(want, variant)
            self._set(want, message="creating the venv")
            pip.run(pip.venv_argv(path, with_pip=not pip.pip_here()), what="python -m venv")
            python = path / "bin" / "python"
            progress = pip.Progress()

            def on_line(line: str) -> None:
                if progress.feed(line):
                    self._set(want, message=progress.step, bytes_done=progress.bytes_done,
                              bytes_total=progress.bytes_total)

            log.info("installing %s (%s) into %s from %s", want, variant.name, path, index_url)
            pip.run(pip.install_argv(python, variant.packages, index_url=index_url, find_links=find_links,
                                     ca_bundle=self._ca_bundle),
                    on_line=on_line, what="pip install")
            if variant.uninstall_after:
                pip.run(pip.pip_argv(python, "uninstall", "-y", *variant.uninstall_after), what="pip uninstall")
            # Every line (run keeps only the last 20): vLLM's lock is 150 packages.
            lock: list[str] = []
            pip.run(pip.pip_argv(python, "freeze", "--all"), on_line=lock.append, what="pip freeze")
            (path / LOCK).write_text("\n".join(lock) + "\n", encoding="utf-8")
            self._set(want, message="probing", bytes_done=progress.bytes_total)
            seen = probe.probe(want, variant, python, scratch=self.dir / ".probe")
        except pip.Failed as f:
            with self._lock:
                e.failures += 1
                failures = e.failures
            retry = self._clock() + prov.retry_after_s(failures, first_s=self._retry[0], cap_s=self._retry[1])
            self._set(want, state=S.Failed, message=str(f), last_output=f.lines, retry_unix=retry,
                      checked_unix=self._clock())
            self._mark(path, want, variant, S.Failed)
            log.warning("installing %s failed (%d in a row; next try in %.0f s): %s", want, failures,
                        retry - self._clock(), f)
            self._notify()
            return
        with self._lock:
            e.failures, e.was_ready = 0, True
        took = self._clock() - began
        self._set(want, state=S.Ready, message=f"{seen}; installed in {took:.1f} s", last_output=(),
                  checked_unix=self._clock(), retry_unix=0.0)
        self._mark(path, want, variant, S.Ready)
        log.info("%s (%s) is Ready in %s after %.1f s: %s", want, variant.name, path, took, seen)
        self._notify()

    def _recheck(self, want: prov.EngineWant) -> None:
        e = self._entries[want]
        assert e.variant is not None
        path = Path(e.install.path)
        first, e.found = e.found, False
        try:
            seen = probe.probe(want, e.variant, path / "bin" / "python", scratch=self.dir / ".probe")
        except pip.Failed as f:
            # Made again at once, from a fresh venv: whatever removed a file may have changed others.
            self._set(want, state=S.Failed, message=f"the re-check failed: {f}; installing it again",
                      last_output=f.lines, retry_unix=0.0, checked_unix=self._clock())
            log.warning("the re-check of %s in %s failed: %s; installing it again", want, path, f)
            self._notify()
            return
        if first:  # found at start: Ready for launches only now that it was seen to run
            self._set(want, state=S.Ready, message=f"found at start; {seen}", checked_unix=self._clock())
            log.info("%s in %s, left by a previous agent, is Ready: %s", want, path, seen)
            self._notify()
        else:
            self._set(want, checked_unix=self._clock())
        log.debug("re-checked %s: %s", want, seen)

    def _fresh_dir(self, want: prov.EngineWant, variant: prov.Variant, path: Path) -> None:
        if path.exists():
            if not (path / MARKER).is_file():
                raise pip.Failed(f"{path} exists and llmgw did not create it (it has no {MARKER}); llmgw never "
                                 "removes a directory it did not make: move it aside", ())
            shutil.rmtree(path)
        path.mkdir(parents=True)
        # The marker first: a directory llmgw made is one it may remove, even if the agent dies mid-install.
        self._mark(path, want, variant, S.Installing, create=True)

    def _os_packages(self, want: prov.EngineWant, variant: prov.Variant) -> None:
        family = (self._node or prov.NodeProfile()).os_family
        need = variant.os_packages_for(family)
        gone = ospkg.missing(family, need) if need else ()
        if gone and self._is_root() and self._os_allowed:
            self._set(want, message=f"installing OS packages {' '.join(gone)}")
            ospkg.install(family, gone)
            gone = ospkg.missing(family, need)
        self._set(want, missing_os_packages=gone, os_install_command=prov.os_install_command(family, gone))
        if gone:
            log.warning("%s needs OS packages %s, missing here; run: %s", want, " ".join(gone),
                        prov.os_install_command(family, gone) or f"your package manager for {' '.join(gone)}")

    def _mark(self, path: Path, want: prov.EngineWant, variant: prov.Variant, state: prov.InstallState, *,
              create: bool = False) -> None:
        # Only a directory llmgw made (it has the marker) is ever marked: marking an operator's directory on a
        # failed install would have made it llmgw's, and the next removal deleted it (a test caught that).
        if not (path / MARKER).is_file() and not create:
            return
        doc = {"engine": want.engine, "version": want.version, "variant": variant.name, "state": state.value}
        tmp = path / (MARKER + ".tmp")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        tmp.replace(path / MARKER)

    def _remove(self, want: prov.EngineWant) -> None:
        with self._lock:
            e = self._entries.get(want)
        if e is None:
            return
        path = Path(e.install.path) if e.install.path else None
        users = self._in_use(path) if path is not None else []
        if users:
            msg = (f"not removed: shard {', '.join(users)} runs it; stop or move those replicas, then remove "
                   "it again")
            self._set(want, message=msg)
            log.warning("removing %s refused: %s", want, msg)
            return
        with self._lock:
            self._wants = tuple(w for w in self._wants if w != want)
            del self._entries[want]
            self._changed = True
        if path is not None and (path / MARKER).is_file():
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s (%s)", want, path)
        elif path is not None and path.exists():
            log.warning("%s is not removed: llmgw did not create it (no %s)", path, MARKER)
        self._notify()

    def _load(self) -> None:
        """The installs a previous agent left: Ready ones are probed again at once, others made again."""
        self._node = self._profile()
        log.info("engine variants for this node: %s, OS family %s, %s", self._node.arch or "unknown architecture",
                 self._node.os_family or "unknown", f"CUDA {self._node.cuda}" if self._node.cuda else "no CUDA")
        if not self.dir.is_dir():
            self.dir.mkdir(parents=True, exist_ok=True)
            return
        for marker in sorted(self.dir.glob(f"*/{MARKER}")):
            try:
                doc = json.loads(marker.read_text(encoding="utf-8"))
                want = prov.EngineWant(str(doc["engine"]), str(doc["version"]))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("ignoring %s: %s", marker, exc)
                continue
            chosen = self._choose(want, self._node)
            if isinstance(chosen, prov.NoVariant) or chosen.name != doc.get("variant"):
                log.warning("%s holds %s %s, not the variant this node takes now; left as it is", marker.parent,
                            want, doc.get("variant"))
                continue
            ready = doc.get("state") == S.Ready.value
            install = prov.EngineInstall(want.engine, want.version, chosen.name,
                                         S.Installing if ready else S.Failed,
                                         "found at start; probing" if ready else "left unfinished; installing again",
                                         path=str(marker.parent))
            with self._lock:
                self._entries[want] = _Entry(install, chosen, found=ready, was_ready=ready)
                self._changed = True
