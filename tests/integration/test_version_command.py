"""``llmgw version`` against a real server and agent: the CLI's, the control plane's and the agent's version,
all the installed package's, none marked as differing."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from llmgw.testing import system as system_mod


def test_llmgw_version_says_every_parts_version(tmp_path: Path) -> None:
    want = importlib.metadata.version("llmgw")
    with system_mod.running(tmp_path) as s:
        done = subprocess.run([sys.executable, "-m", "llmgw", "version", "--url", s.url], capture_output=True,
                              text=True, timeout=60, env=s.cli_env())
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[0] == ["cli", want]
    assert any(r[:2] == ["control", "plane"] and r[-1] == want for r in rows), done.stdout + done.stderr
    assert ["agent", "node1", want] in rows, done.stdout
    assert "differs" not in done.stdout
