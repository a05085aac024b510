"""The Anthropic schemas shipped in the repository are what their generator makes from the pinned SDK."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic

from llmgw.testing.anthropic import make_schemas

SHIPPED = Path(make_schemas.__file__).resolve().parent / "schemas.json"


def test_the_shipped_schemas_are_the_pinned_sdks() -> None:
    pin = next(line for line in (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text().splitlines()
               if '"anthropic==' in line)
    assert f"anthropic=={anthropic.__version__}" in pin, (
        f"anthropic {anthropic.__version__} is installed, pyproject.toml pins {pin.strip()}: reinstall the test extra")
    shipped = json.loads(SHIPPED.read_text())
    assert shipped == make_schemas.build(), (
        "llmgw/testing/anthropic/schemas.json differs from what make_schemas.py makes from this SDK; regenerate it "
        "(see llmgw/testing/anthropic/SOURCE.md)")
    assert {"Message", "MessageTokensCount", "RawMessageStreamEvent", "ErrorResponse"} <= shipped["$defs"].keys()
