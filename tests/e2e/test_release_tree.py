"""llmgw.testing.releases on a working tree that changes: uncommitted files built as they are, a change built
anew, and the releases of trees unused for a day pruned. Three builds and a clone: in ``make test-e2e``.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from llmgw.testing import releases

REPO = Path(__file__).resolve().parents[2]


def test_the_working_tree_is_built_as_it_is_uncommitted_changes_included(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(REPO), str(clone)], check=True)
    (clone / "llmgw" / "_uncommitted_probe.py").write_text("SAID = 'uncommitted'\n")
    (clone / "llmgw" / "testing" / "burst.py").unlink()  # tracked, deleted, not committed
    release = releases.build(clone, None, tmp_path / "cache")
    assert release.built
    probe = "import llmgw._uncommitted_probe as m; print(m.__file__, m.SAID)"
    said = subprocess.run(release.python_argv("-c", probe), cwd=release.venv, env=release.env(), check=True,
                          capture_output=True, text=True).stdout.split()
    assert Path(said[0]).is_relative_to(release.venv) and said[1] == "uncommitted"
    assert not list(release.venv.glob("lib/python*/site-packages/llmgw/testing/burst.py"))
    # A change makes another release; the same tree again is the same one.
    (clone / "llmgw" / "_uncommitted_probe.py").write_text("SAID = 'changed'\n")
    changed = releases.build(clone, None, tmp_path / "cache")
    assert changed.built and changed.venv != release.venv and changed.tree != release.tree
    # A tree's release unused for a day goes when another tree's is built; one used since stays.
    day_ago = time.time() - releases.PRUNE_AFTER_S - 60
    os.utime(release.venv.parent / releases.MARKER, (day_ago, day_ago))
    os.utime(changed.venv.parent / releases.MARKER, (day_ago, day_ago))
    assert releases.build(clone, None, tmp_path / "cache").built is False  # `changed` again: used now
    (clone / "llmgw" / "_uncommitted_probe.py").write_text("SAID = 'third'\n")
    third = releases.build(clone, None, tmp_path / "cache")
    assert third.built and not release.venv.exists() and changed.python.exists()
