"""A release of llmgw built into a venv of its own, for the upgrade tests: the previous release and this tree.

``previous_commit(repo)`` reads ``tests/upgrade/PREVIOUS`` (the previous release's commit; moving it is part of
cutting each release). ``build(repo, ref, cache_root)`` installs a commit of the repository's history (``git
archive``) or the working tree as it is (HEAD with its uncommitted changes) into a venv under ``cache_root``,
keyed by the commit (or a hash of the tree's files) and by the running interpreter, so a second test run reuses it.

Built fast: the venv is made without pip, and a ``.pth`` file in it names the running interpreter's
site-packages, so the release imports the test venv's dependencies without installing them again (the
``.pth`` files of that directory are not processed, so the test venv's editable llmgw is not picked up: the
venv's own llmgw comes first; another ``.pth`` drops PYTHONPATH at start, so a checkout named there never
shadows it). Then ``pip install --no-deps --no-build-isolation SRC`` installs the release,
and a run of its Python and of its ``llmgw`` script checks it imports its own copy at its own version.

Concurrency: one lock file per release; a venv cannot be moved once made (its scripts name its path), so it is
built in its final place under the lock and a marker (``release.json``) is written last, atomically: a
directory without the marker is a build that died and is built again; one with it is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

#: The file naming the previous release, relative to the repository's root.
PREVIOUS = Path("tests/upgrade/PREVIOUS")
#: The marker a finished build writes last; its presence is what "built" means.
MARKER = "release.json"
#: This module's way of building a venv: a change to it makes every release again (a new key).
RECIPE = 2
#: A working tree's release unused this long is removed when another tree's is built.
PRUNE_AFTER_S = 24 * 3600
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: What a release's processes must not inherit: a checkout on their path would shadow the release's llmgw.
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONSAFEPATH")


class ReleaseError(RuntimeError):
    """A release could not be named or built; the message says what was wrong and what to do."""


@dataclasses.dataclass(frozen=True)
class Release:
    """One built release: its venv's Python and ``llmgw`` script, the version it says, the commit it came from.

    ``commit`` is the commit built, or HEAD's for the working tree (then ``tree`` is the hash of its files);
    ``built`` is False when an earlier build was reused (no pip run).
    """

    python: Path
    llmgw: Path
    version: str
    commit: str
    venv: Path
    tree: str | None = None
    built: bool = False

    def env(self, extra: Mapping[str, str] | None = None, *, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """An environment for the release's processes: ``base`` (default ``os.environ``) without PYTHONPATH and
        the like, the venv's ``bin`` first on PATH, then ``extra``."""
        env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROPPED_ENV}
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env.get("PATH", os.defpath)])
        env["VIRTUAL_ENV"] = str(self.venv)
        env.update(extra or {})
        return env

    def argv(self, *args: str) -> list[str]:
        """``llmgw ARGS…`` of this release."""
        return [str(self.llmgw), *args]

    def python_argv(self, *args: str) -> list[str]:
        """``python ARGS…`` of this release's venv."""
        return [str(self.python), *args]

    def run(self, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``llmgw ARGS…`` to completion (output captured; raises ReleaseError, with the output, on failure).

        ``cwd`` defaults to the venv (never a checkout, whose ``llmgw/`` would shadow the release's)."""
        return _run(self.argv(*args), cwd=cwd or self.venv, env=self.env(env), timeout=timeout,
                    what=f"llmgw {self.version} ({self.commit[:12]})")


def previous_commit(repo: Path) -> str:
    """The previous release's commit, as named in ``repo/tests/upgrade/PREVIOUS`` (``#`` lines are comments)."""
    path = Path(repo) / PREVIOUS
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ReleaseError(f"{path} is missing: it names the previous release's commit (40 hex digits), "
                           "one line; create it (README, 'Cutting a release')") from None
    words = [w for line in text.splitlines() if not line.lstrip().startswith("#") for w in line.split()]
    if len(words) != 1 or not _COMMIT.fullmatch(words[0]):
        raise ReleaseError(f"{path} must name one commit as 40 lower-case hex digits (comments start with #); "
                           f"it has {words!r}")
    commit = words[0]
    if subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode != 0:
        shallow = _git(repo, "rev-parse", "--is-shallow-repository").strip() == "true"
        raise ReleaseError(f"{path} names commit {commit}, which is not in the history of {repo}"
                           + (" (a shallow clone)" if shallow else "")
                           + ": fetch the full history (git fetch --unshallow, or clone without --depth)")
    return commit


def default_cache_root(repo: Path) -> Path:
    """``REPO/test-artifacts/releases`` (gitignored): a clean clone builds each release once per run."""
    return Path(repo) / "test-artifacts" / "releases"


def build(repo: Path, ref: str | None, cache_root: Path) -> Release:
    """The release at commit ``ref`` of ``repo`` (or the working tree as it is when ``ref`` is None), installed
    into its own venv under ``cache_root``; reused when an earlier build of the same source is there."""
    repo = Path(repo).resolve()
    cache_root = Path(cache_root).resolve()
    cache_root.mkdir(parents=True, exist_ok=True)
    tree: str | None = None
    if ref is None:
        commit = _git(repo, "rev-parse", "HEAD").strip()
        files = _tree_files(repo)
        tree = _tree_hash(repo, files)
        key = f"tree-{tree[:20]}"
    else:
        commit = _resolve(repo, ref)
        key = f"commit-{commit}"
    key += f"-py{sys.version_info.major}{sys.version_info.minor}-{_interpreter_key()}-r{RECIPE}"
    home = cache_root / key
    with _locked(cache_root / f"{key}.lock"):
        found = _reuse(home)
        if found is not None:
            os.utime(home / MARKER)  # used now: not pruned
            return found
        if ref is None:
            _prune_trees(cache_root, keep=key)
        shutil.rmtree(home, ignore_errors=True)  # a build that died before its marker
        home.mkdir(parents=True)
        src = home / "src"
        if ref is None:
            _copy_tree(repo, files, src)
        else:
            _archive(repo, commit, src)
        release = _install(src, home, commit=commit, tree=tree)
        shutil.rmtree(src, ignore_errors=True)
        tmp = home / f".{MARKER}.{os.getpid()}"
        tmp.write_text(json.dumps({"version": release.version, "commit": commit, "tree": tree}))
        os.replace(tmp, home / MARKER)
        return release


def copy_working_tree(repo: Path, dest: Path) -> Path:
    """The working tree of ``repo`` as it is (tracked and untracked-but-not-ignored files) copied into ``dest``."""
    repo = Path(repo).resolve()
    _copy_tree(repo, _tree_files(repo), Path(dest))
    return Path(dest)


def _prune_trees(cache_root: Path, *, keep: str) -> None:
    """Each edit of the tree makes another release: those unused for a day go (one being built
    meanwhile, locked, stays)."""
    for marker in cache_root.glob(f"tree-*/{MARKER}"):
        home = marker.parent
        try:
            if home.name == keep or time.time() - marker.stat().st_mtime < PRUNE_AFTER_S:
                continue
        except FileNotFoundError:  # another process pruned it meanwhile
            continue
        with open(cache_root / f"{home.name}.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            marker.unlink(missing_ok=True)  # first, so a half-removed release is never taken as built
            shutil.rmtree(home, ignore_errors=True)


def _reuse(home: Path) -> Release | None:
    try:
        said = json.loads((home / MARKER).read_text())
    except (FileNotFoundError, ValueError):
        return None
    venv = home / "venv"
    if not (venv / "bin" / "python").exists():
        return None
    return Release(python=venv / "bin" / "python", llmgw=venv / "bin" / "llmgw", version=said["version"],
                   commit=said["commit"], venv=venv, tree=said.get("tree"), built=False)


def _install(src: Path, home: Path, *, commit: str, tree: str | None) -> Release:
    venv = home / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=home, env=_clean_env(), timeout=120,
         what="python -m venv")
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=home,
                     env=_clean_env(), timeout=60, what="the venv's python").stdout.strip())
    # The running interpreter's site-packages, appended after the venv's own: its dependencies, not its llmgw.
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_llmgw_test_deps.pth").write_text("".join(f"{p}\n" for p in ours))
    # PYTHONPATH is dropped at start (and for the children): a checkout on it would shadow the release's llmgw,
    # and an upgrade test would run HEAD against HEAD without a word.
    (site / "_llmgw_release_guard.pth").write_text(_GUARD)
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-deps",
          "--no-build-isolation", "--no-index", str(src)], cwd=home, env=_clean_env(), timeout=600,
         what=f"pip install of llmgw at {commit[:12]}")
    want = _source_version(src)
    probe = ("import importlib.metadata, json, llmgw; "
             "print(json.dumps({'file': llmgw.__file__, 'version': importlib.metadata.version('llmgw')}))")
    probed = _run([str(python), "-c", probe], cwd=venv, env=_clean_env(), timeout=60,
                  what="import llmgw in the built venv")
    if probed.stderr.strip():
        raise ReleaseError(f"the venv built at {venv} says on stderr at start: {probed.stderr.strip()[-2000:]}")
    said = json.loads(probed.stdout.strip().splitlines()[-1])
    if not Path(said["file"]).resolve().is_relative_to(venv.resolve()) or said["version"] != want:
        raise ReleaseError(f"the venv built at {venv} imports llmgw {said['version']} from {said['file']}, "
                           f"not its own {want}: something on its path shadows it (PYTHONPATH, a .pth file)")
    release = Release(python=python, llmgw=venv / "bin" / "llmgw", version=want, commit=commit, venv=venv,
                      tree=tree, built=True)
    release.run("--help", timeout=120)
    return release


#: A .pth line runs in site.addpackage's function scope, where a comprehension cannot see its locals: hence exec.
_GUARD_CODE = ("import os, sys\n"
               "drop = [os.path.abspath(e) for e in os.environ.pop('PYTHONPATH', '').split(os.pathsep) if e]\n"
               "sys.path[:] = [e for e in sys.path if os.path.abspath(e) not in drop]\n")
_GUARD = f"import os; exec({_GUARD_CODE!r}, {{}})\n"


def _source_version(src: Path) -> str:
    import tomllib

    return str(tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"])


def _interpreter_key() -> str:
    """The test venv the release borrows its dependencies from: a venv made for another is not reused."""
    return hashlib.sha256(f"{sys.prefix}\0{sys.executable}".encode()).hexdigest()[:10]


def _resolve(repo: Path, ref: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"{ref!r} is not a commit of {repo}'s history: name one it has, or fetch the full "
                           "history (git fetch --unshallow)")
    return done.stdout.strip()


def _tree_files(repo: Path) -> list[str]:
    """The working tree's files: tracked and untracked-but-not-ignored, those that exist (a deleted one is gone)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "-co", "--exclude-standard"], check=True,
                         capture_output=True).stdout.decode()
    names = sorted({n for n in out.split("\0") if n})
    return [n for n in names if os.path.lexists(repo / n) and not (repo / n).is_dir()]


def _tree_hash(repo: Path, files: Sequence[str]) -> str:
    h = hashlib.sha256()
    for name in files:
        path = repo / name
        h.update(name.encode() + b"\0")
        if path.is_symlink():
            h.update(b"link\0" + os.readlink(path).encode())
        else:
            h.update(b"x\0" if os.access(path, os.X_OK) else b"f\0")
            h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _copy_tree(repo: Path, files: Sequence[str], dest: Path) -> None:
    for name in files:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target, follow_symlinks=False)


def _archive(repo: Path, commit: str, dest: Path) -> None:
    """``git archive COMMIT`` unpacked into ``dest`` (streamed; the ``data`` filter, where there is one, refuses
    odd members)."""
    dest.mkdir(parents=True)
    with subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4+
                tar.extractall(dest, filter="data")
            else:  # this repository's own history, written by git
                tar.extractall(dest)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise ReleaseError(f"git archive {commit} failed: {err.strip()}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV and k != "VIRTUAL_ENV"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _run(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float,
         what: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ReleaseError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n"
                           f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return done
