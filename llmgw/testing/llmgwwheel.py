"""A wheelhouse holding llmgw itself, for the agent-upgrade tests: this working tree built at another version.

``build`` copies the tree's ``pyproject.toml``, ``README.md`` and ``llmgw/`` to a scratch directory, writes the
version asked for into the copy's ``pyproject.toml`` (the real file is never touched) and runs ``pip wheel
--no-deps --no-build-isolation`` on it (setuptools from this venv, nothing fetched): a few seconds.

``dependencies`` fills a directory with the wheels of llmgw's dependencies by ``pip download`` through this
machine's ordinary pip setup and its cache, once: it is kept under the gitignored ``test-artifacts/``, keyed by
the dependency list and the Python, and reused by the next run (made complete first, then renamed in place).
``wheelhouse`` puts the two together (the dependencies linked, not copied) in a directory to serve.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
CACHE = REPO / "test-artifacts" / "llmgw-deps"


def build(out_dir: Path, version: str, *, source: Path = REPO) -> Path:
    """``llmgw-VERSION-py3-none-any.whl`` in ``out_dir``, built from ``source`` with its version set to ``version``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llmgw-wheel-") as tmp:
        tree = Path(tmp) / "llmgw-src"
        tree.mkdir()
        shutil.copy2(source / "README.md", tree / "README.md")
        shutil.copytree(source / "llmgw", tree / "llmgw", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        text = (source / "pyproject.toml").read_text(encoding="utf-8")
        patched, n = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{version}"', text, count=1)
        assert n == 1, "pyproject.toml has no version line to patch"
        (tree / "pyproject.toml").write_text(patched, encoding="utf-8")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                        "--no-build-isolation", "-w", str(out_dir), str(tree)], check=True, stdin=subprocess.DEVNULL,
                       cwd=tmp)
    wheels = sorted(out_dir.glob(f"llmgw-{version}-*.whl"))
    assert wheels, f"pip wheel left no llmgw {version} wheel in {out_dir}"
    return wheels[0]


def requirements(source: Path = REPO) -> list[str]:
    """llmgw's dependencies as ``pyproject.toml`` lists them (no extras)."""
    doc = tomllib.loads((source / "pyproject.toml").read_text(encoding="utf-8"))
    return [str(r) for r in doc["project"]["dependencies"]]


def dependencies(*, cache: Path = CACHE, source: Path = REPO) -> Path:
    """A directory with the wheels of llmgw's dependencies (downloaded once, then reused from ``cache``)."""
    reqs = requirements(source)
    key = hashlib.sha256("\n".join([sys.version, *reqs]).encode()).hexdigest()[:16]
    done = cache / key
    if done.is_dir():
        return done
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache))
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--only-binary", ":all:", "-d", str(partial), *reqs], check=True, stdin=subprocess.DEVNULL)
        os.rename(partial, done)
    except OSError:
        if not done.is_dir():  # another run finished first: its copy is as good
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return done


def wheelhouse(out_dir: Path, version: str) -> Path:
    """``out_dir`` holding llmgw ``version`` built from this tree and its dependencies' wheels (linked)."""
    build(out_dir, version)
    for wheel in dependencies().iterdir():
        link = out_dir / wheel.name
        if not link.exists():
            link.symlink_to(wheel)
    return out_dir
