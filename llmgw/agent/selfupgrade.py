"""The agent upgrades itself (issue 29, `llmgw node upgrade`): install another llmgw, check it, re-execute into it.

On ``UpgradeAgent`` the agent installs ``llmgw==V`` into ``STATE_DIR/llmgw/<V>/``, a venv of its own made from
the running interpreter's base Python, the way engines are installed (``provision.pip``: argv lists, pip's
configuration and ``PIP_*`` ignored, ONLY the index the control plane names, never the public one). It then
runs the new venv's Python (isolated, ``-I``: no ``PYTHONPATH``, no current directory) to import the agent and
print its version, which must be V. Then it says RESTARTING, and ``main.run`` ends as a stopping agent does,
except that the engines are never stopped (not even with ``--stop-engines-on-exit``): ``exec_into`` then
replaces this process with ``NEW_VENV/bin/python -I -m llmgw <the same arguments>``. The same pid, the same
parent (a service manager sees no exit), the same children: the new agent adopts the engines from the state
directory before it registers, as after any restart. Every descriptor but 0-2 is made close-on-exec first, so
the old gRPC channel's sockets and the old log files do not leak into the new process.

A refusal is said at once (FAILED): an upgrade already under way, a malformed version (``core.agentupgrade``),
no index named, an agent that does not run as its own ``llmgw agent`` process. A failed install or check is
FAILED with pip's (or the check's) last lines; the running agent goes on as it was, and the half-made venv is
removed (only a directory holding ``MARKER``, which llmgw writes first, is ever removed). A lock file per
version (``STATE_DIR/llmgw/.V.lock``, flock) keeps two attempts from ever sharing a venv; a complete venv of
that version (its marker says ready, and the check passes) is reused.

The upgrade outlasts the process: ``STATE_DIR/llmgw/current.json`` names the release it moved to, and an agent
started later by an older llmgw (the service manager's command line, after a reboot or a crash) re-executes into
that venv at once (``resume_python``), as long as its marker says ready and it is newer than the one started.
An operator who installs a newer llmgw on the node simply starts it (older ones are passed over); removing
``current.json`` runs the installed llmgw whatever it is.

An engine adopted after the re-exec is still this process's child: the supervisor's orphan watch reaps it when it
exits (``supervisor.orphans``), so none is left a zombie.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from llmgw.agent.provision import pip
from llmgw.core.agentupgrade import State, UpgradeRequest, UpgradeStatus, release_key, version_problem

log = logging.getLogger(__name__)

DIR = "llmgw"
MARKER = ".llmgw-upgrade.json"
#: The release the last upgrade moved this node's agent to (``remember``); an agent started later from an older
#: llmgw (the unit file's, after a reboot) re-executes into it (``resume_python``).
CURRENT = "current.json"
LOCK = "llmgw-lock.txt"
NO_INDEX = ("no package index is named for the upgrade: start the control plane with --engine-index URL "
            "(the index engines are installed from, which must hold llmgw and its dependencies)")
#: What the new venv's Python runs to check it: the agent imports (grpc, the supervisor) and says its version.
CHECK = "import llmgw.agent.main, llmgw.cli.main; from llmgw.core.version import version; print(version())"
CHECK_TIMEOUT_S = 120.0

Send = Callable[[UpgradeStatus], None]


def base_python() -> str:
    """The Python the running interpreter was made from (a venv's base), which the new venv is made from."""
    return getattr(sys, "_base_executable", "") or sys.executable


def venv_dir(state_dir: Path, version: str) -> Path:
    """Where llmgw ``version`` is installed (``version`` checked by ``version_problem`` before)."""
    return state_dir / DIR / version


class SelfUpgrade:
    """One upgrade at a time: ``begin`` refuses or starts one; on success ``restart`` gets the new Python."""

    def __init__(self, state_dir: Path, *, running_version: str, restart: Callable[[Path], None],
                 ca_bundle: Path | None = None, argv: Sequence[str] | None = None) -> None:
        self.state_dir, self.running_version, self._restart = state_dir, running_version, restart
        self._ca_bundle = ca_bundle
        self._argv = list(sys.argv if argv is None else argv)
        self._busy: UpgradeRequest | None = None
        self._task: asyncio.Task[None] | None = None

    def refusal(self, req: UpgradeRequest) -> str:
        """Why ``req`` is refused at once ("" when it is taken)."""
        if self._busy is not None:
            return (f"an upgrade to {self._busy.version} (attempt {self._busy.id}) is already under way on this node; "
                    "wait for it to end (`llmgw get nodes` shows it)")
        if problem := version_problem(req.version):
            return problem
        if req.version == self.running_version:
            return f"this agent already runs llmgw {req.version}; nothing to do"
        if not req.index_url:
            return NO_INDEX
        if len(self._argv) < 2 or self._argv[1] != "agent":
            return ("this agent does not run as its own `llmgw agent` process (it was started as "
                    f"{Path(self._argv[0]).name if self._argv else '?'} {' '.join(self._argv[1:2])}); install the new "
                    "llmgw on the node and restart the agent instead")
        return ""

    def begin(self, req: UpgradeRequest, send: Send) -> None:
        """On the event loop: refuses ``req`` at once (FAILED), or installs it in a worker thread."""
        if why := self.refusal(req):
            log.warning("upgrade to %r refused: %s", req.version[:80], why)
            send(UpgradeStatus(req.id, req.version, State.FAILED, why))
            return
        self._busy = req
        log.info("upgrading this agent to llmgw %s from %s (attempt %s)", req.version, req.index_url, req.id)
        self._task = asyncio.create_task(self._run(req, send), name=f"upgrade to {req.version}")

    async def _run(self, req: UpgradeRequest, send: Send) -> None:
        def step(message: str) -> None:
            send(UpgradeStatus(req.id, req.version, State.INSTALLING, message))

        loop = asyncio.get_running_loop()
        try:
            python = await asyncio.to_thread(
                self._install, req, lambda m: loop.call_soon_threadsafe(step, m))
        except pip.Failed as f:
            log.warning("upgrading to llmgw %s failed; this agent (llmgw %s) goes on: %s", req.version,
                        self.running_version, f)
            send(UpgradeStatus(req.id, req.version, State.FAILED, str(f), f.lines))
            self._busy = None
            return
        except Exception as e:  # a bug here must not end the agent, and must be said
            log.exception("upgrading to llmgw %s failed unexpectedly", req.version)
            send(UpgradeStatus(req.id, req.version, State.FAILED,
                               f"the upgrade failed on the agent ({type(e).__name__}: {e}); see its log"))
            self._busy = None
            return
        try:
            remember(self.state_dir, req.version)
        except OSError as e:  # the upgrade still happens; a restart later would run the older llmgw
            log.warning("cannot record the upgrade in %s (%s): a restart of this agent would run llmgw %s again",
                        self.state_dir / DIR / CURRENT, e, self.running_version)
        send(UpgradeStatus(req.id, req.version, State.RESTARTING, f"re-executing into {python}"))
        log.info("llmgw %s is installed and checked in %s; re-executing into it (the engines keep running)",
                 req.version, python.parent.parent)
        self._restart(python)

    # -- the install (a worker thread) ---------------------------------------------------------------------------
    def _install(self, req: UpgradeRequest, step: Callable[[str], None]) -> Path:
        root = self.state_dir / DIR
        # 0711, the venvs 0755: the engines (users of their own, as root) run llmgw's built-in engines with the
        # agent's Python, the new venv's once the agent re-executes (found by the e2e test: 0700 failed them).
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        target = venv_dir(self.state_dir, req.version)
        with open(root / f".{req.version}.lock", "a+b") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise pip.Failed(f"another process is installing llmgw {req.version} into {target}; try again "
                                 "when it is done", ()) from None
            python = target / "bin" / "python"
            if _marked(target) == "ready":
                step("checking the venv left by an earlier upgrade")
                try:
                    self._check(python, req.version)
                    log.info("reusing %s: llmgw %s, installed and checked before", target, req.version)
                    return python
                except pip.Failed as f:
                    log.warning("%s does not pass the check any more (%s); installing it again", target, f)
            try:
                self._make(req, target, step)
                step("checking")
                self._check(python, req.version)
            except BaseException:
                _remove(target)
                raise
            _mark(target, req.version, "ready")
            return python

    def _make(self, req: UpgradeRequest, target: Path, step: Callable[[str], None]) -> None:
        if target.exists():
            if not (target / MARKER).is_file():
                raise pip.Failed(f"{target} exists and llmgw did not create it (it has no {MARKER}); llmgw never "
                                 "removes a directory it did not make: move it aside", ())
            shutil.rmtree(target)
        target.mkdir(mode=0o755)
        os.chmod(target, 0o755)
        _mark(target, req.version, "installing")  # first: a directory llmgw made is one it may remove
        step("creating the venv")
        # With pip when this agent has one: the new agent then makes engines' venvs as fast as this one does.
        pip.run([base_python(), "-m", "venv", *([] if pip.pip_here() else ["--without-pip"]), str(target)],
                env=_env(), what="python -m venv")
        python = target / "bin" / "python"
        progress = pip.Progress()

        def on_line(line: str) -> None:
            if progress.feed(line):
                step(progress.step)

        step("resolving")
        pip.run(pip.install_argv(python, (f"llmgw=={req.version}",), index_url=req.index_url,
                                 find_links=req.find_links, ca_bundle=self._ca_bundle),
                on_line=on_line, env=_env(), what="pip install")
        frozen: list[str] = []
        pip.run(pip.pip_argv(python, "freeze", "--all"), on_line=frozen.append, env=_env(), what="pip freeze")
        (target / LOCK).write_text("\n".join(frozen) + "\n", encoding="utf-8")

    def _check(self, python: Path, version: str) -> None:
        """Runs the new agent's imports in its own Python, isolated, and checks the version it says."""
        lines = pip.run([str(python), "-I", "-c", CHECK], timeout_s=CHECK_TIMEOUT_S, env=_env(),
                        what="the check of the new llmgw")
        said = lines[-1].strip() if lines else ""
        if said != version:
            raise pip.Failed(f"the installed llmgw says it is {said[:80]!r}, not {version}; the index's package is "
                             "not the release asked for", lines)


def _env() -> dict[str, str]:
    """pip's clean environment (``provision.pip``), without ``PYTHONPATH``/``PYTHONHOME`` too: pip must see only the
    new venv, so that a package the agent's path holds is installed into it all the same."""
    return {k: v for k, v in pip.clean_env().items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _marked(target: Path) -> str:
    try:
        return str(json.loads((target / MARKER).read_text(encoding="utf-8")).get("state", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def _mark(target: Path, version: str, state: str) -> None:
    tmp = target / (MARKER + ".tmp")
    tmp.write_text(json.dumps({"version": version, "state": state}), encoding="utf-8")
    tmp.replace(target / MARKER)


def _remove(target: Path) -> None:
    """Removes a half-made venv, only if llmgw made it (it has the marker)."""
    if (target / MARKER).is_file():
        shutil.rmtree(target, ignore_errors=True)


def remember(state_dir: Path, version: str) -> None:
    """Records ``version`` as the release this node's agent runs from now on (``resume_python`` reads it)."""
    root = state_dir / DIR
    tmp = root / (CURRENT + ".tmp")
    tmp.write_text(json.dumps({"version": version}), encoding="utf-8")
    tmp.replace(root / CURRENT)


def resume_python(state_dir: Path, running_version: str, argv: Sequence[str] | None = None) -> Path | None:
    """At start: the Python of the release an earlier upgrade moved this agent to, when this process should
    re-execute into it (it is newer than ``running_version``, complete, and this is an ``llmgw agent``); else None."""
    args = list(sys.argv if argv is None else argv)
    if len(args) < 2 or args[1] != "agent" or version_problem(running_version):
        return None  # a checkout ("dev") or anything that is not the agent is left as started
    try:
        wanted = str(json.loads((state_dir / DIR / CURRENT).read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if version_problem(wanted) or release_key(wanted) <= release_key(running_version):
        return None
    python = venv_dir(state_dir, wanted) / "bin" / "python"
    if _marked(venv_dir(state_dir, wanted)) != "ready" or not python.is_file():
        log.warning("%s names llmgw %s, whose venv is not complete; running llmgw %s as started",
                    state_dir / DIR / CURRENT, wanted, running_version)
        return None
    return python


def exec_argv(python: Path, argv: Sequence[str]) -> list[str]:
    """The new agent's command line: the new venv's Python, isolated, running llmgw with this agent's arguments."""
    return [str(python), "-I", "-m", "llmgw", *argv[1:]]


def exec_into(python: Path, argv: Sequence[str] | None = None) -> None:
    """Replaces this process with the agent of ``python``'s venv (never returns unless the exec fails).

    Every descriptor above 2 is made close-on-exec first (the old gRPC channel's sockets, log files, the state
    files' handles): only stdin, stdout and stderr pass to the new agent. Should the exec itself fail, the old
    agent is started again the same way, so the node is never left without one.
    """
    args = exec_argv(python, list(sys.argv if argv is None else argv))
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _cloexec_all()
    try:
        os.execv(args[0], args)
    except OSError as e:
        print(f"llmgw agent: re-executing into {python} failed ({e}); starting the old agent again", file=sys.stderr)
        old = list(sys.orig_argv)
        os.execv(sys.executable, [sys.executable, *old[1:]])


def _cloexec_all() -> None:
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)
