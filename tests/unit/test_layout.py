"""Project rules that are checked, not only written down."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from llmgw.cli.defaults import DEFAULT_MODEL
from llmgw.core import specs

ROOT = Path(__file__).resolve().parents[2]


def test_generated_grpc_code_is_fresh() -> None:
    """The committed stubs match proto/ (regenerate with `python -m llmgw.api.codegen`)."""
    out = subprocess.run([sys.executable, "-m", "llmgw.api.codegen", "--check"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_import_contracts_hold() -> None:
    """control, agent and router never import each other; decision code stays pure (.importlinter)."""
    out = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "broken" in out.stdout and "0 broken" in out.stdout


def test_examples_are_valid_and_default_matches() -> None:
    """Every example parses, and the one `up` serves equals examples/smollm2-135m.yaml."""
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            specs.parse_manifest(doc)
    example = yaml.safe_load((ROOT / "examples" / "smollm2-135m.yaml").read_text())
    assert specs.parse_manifest(example) == specs.parse_manifest(DEFAULT_MODEL)
