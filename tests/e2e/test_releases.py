"""llmgw.testing.releases: the previous release (tests/upgrade/PREVIOUS) and the working tree, each built into a
venv of its own with real git and real pip, importing its own code at its own version, and reused when built.

Each build takes a few seconds (the venv borrows the test venv's dependencies), so these run in ``make test``;
tests/e2e/test_release_tree.py builds a changing working tree three times.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from llmgw.testing import releases
from llmgw.testing.releases import Release, ReleaseError

REPO = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _imports(release: Release, module: str = "llmgw") -> dict[str, str]:
    """What the release's Python imports, run with a checkout on PYTHONPATH (the release's env drops it)."""
    probe = (f"import importlib.metadata, json, {module} as m; "
             "print(json.dumps({'file': m.__file__, 'version': importlib.metadata.version('llmgw')}))")
    env = release.env(base={**os.environ, "PYTHONPATH": str(REPO)})
    done = subprocess.run(release.python_argv("-c", probe), cwd=release.venv, env=env, capture_output=True,
                          text=True, check=True)
    return dict(json.loads(done.stdout))


def _version_at(commit: str | None) -> str:
    """The version pyproject.toml says at a commit (None: the working tree), read without building anything."""
    text = (REPO / "pyproject.toml").read_text() if commit is None else _git(REPO, "show", f"{commit}:pyproject.toml")
    return str(tomllib.loads(text)["project"]["version"])


def _site(release: Release) -> str:
    """The venv's site-packages, relative to the release's home (the venv's parent)."""
    (site,) = release.venv.glob("lib/python*/site-packages")
    return str(site.relative_to(release.venv.parent))


def test_previous_and_working_tree_build_into_venvs_of_their_own(tmp_path: Path) -> None:
    commit = releases.previous_commit(REPO)
    assert commit == _git(REPO, "rev-parse", f"{commit}^{{commit}}").strip()
    previous = releases.build(REPO, commit, tmp_path)
    head = releases.build(REPO, None, tmp_path)
    assert (previous.version, previous.commit, previous.built) == (_version_at(commit), commit, True)
    assert (head.version, head.commit, head.built) == (_version_at(None), _git(REPO, "rev-parse", "HEAD").strip(), True)
    assert head.tree and previous.tree is None
    assert previous.venv != head.venv
    for release in (previous, head):
        said = _imports(release)
        assert Path(said["file"]).is_relative_to(release.venv), said
        assert said["version"] == release.version
        out = release.run("version", env={"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "LLMGW_URL": ""}).stdout
        assert out.split()[:2] == ["cli", release.version], out
        # What the release runs at run time is there: the store's migrations, the UI's templates.
        pkg = Path(said["file"]).parent
        assert (pkg / "control/store/migrations/env.py").is_file()
        assert len(list((pkg / "control/store/migrations/versions").glob("0*.py"))) >= 15
        assert list((pkg / "control/ui/templates").glob("*.html"))

    # Run with a checkout on PYTHONPATH and not through Release.env, the release still imports its own llmgw.
    probe = "import llmgw, os; print(llmgw.__file__, os.environ.get('PYTHONPATH'))"
    done = subprocess.run(previous.python_argv("-c", probe), cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    assert done.stdout.split() == [str(previous.venv.parent / _site(previous) / "llmgw" / "__init__.py"), "None"]

    # Built once: the second build is the first one, reused (no pip run).
    assert releases.build(REPO, commit, tmp_path) == dataclasses.replace(previous, built=False)
    assert releases.build(REPO, None, tmp_path) == dataclasses.replace(head, built=False)


def test_two_processes_building_one_release_at_once_build_it_once(tmp_path: Path) -> None:
    script = ("import json, sys; from pathlib import Path; from llmgw.testing import releases; "
              "r = releases.build(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])); "
              "print(json.dumps({'built': r.built, 'venv': str(r.venv), 'version': r.version}))")
    commit = releases.previous_commit(REPO)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(REPO), commit, str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["built"] for o in outs) == [False, True]
    assert outs[0]["venv"] == outs[1]["venv"] and outs[0]["version"] == _version_at(commit)
    said = _imports(releases.build(REPO, commit, tmp_path))
    assert said["version"] == _version_at(commit)


def test_previous_names_a_commit_of_the_full_history(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
    with pytest.raises(ReleaseError, match=r"tests/upgrade/PREVIOUS is missing.*create it"):
        releases.previous_commit(clone)
    (clone / "tests" / "upgrade").mkdir(parents=True)
    previous = clone / releases.PREVIOUS
    previous.write_text("# a comment\nnot-a-commit\n")
    with pytest.raises(ReleaseError, match="one commit as 40 lower-case hex digits"):
        releases.previous_commit(clone)
    previous.write_text("# a commit no history has\n" + "0123456789" * 4 + "\n")
    with pytest.raises(ReleaseError, match="not in the history.*fetch the full history"):
        releases.previous_commit(clone)
    with pytest.raises(ReleaseError, match="not a commit"):
        releases.build(clone, "0123456789" * 4, tmp_path / "cache")

    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--no-checkout", f"file://{REPO}", str(shallow)],
                   check=True)
    (shallow / "tests" / "upgrade").mkdir(parents=True)
    (shallow / releases.PREVIOUS).write_text((REPO / releases.PREVIOUS).read_text())
    assert _git(shallow, "rev-parse", "HEAD").strip() != releases.previous_commit(REPO)  # PREVIOUS is behind HEAD
    with pytest.raises(ReleaseError, match=r"shallow clone.*git fetch --unshallow"):
        releases.previous_commit(shallow)
