"""An adapter's local source on a node: inside the agent's source roots, a directory with adapter_config.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent import sourcepaths, weights
from llmgw.core.errors import EngineError


def test_an_adapter_directory_inside_the_roots_resolves(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    resolve = weights.adapter_resolver(sourcepaths.Roots.of([tmp_path]))
    assert resolve(f"file://{tmp_path / 'a'}") == str(tmp_path / "a")


@pytest.mark.parametrize(("source", "words"), [
    ("file:///etc", "source roots"),
    ("{tmp}/bare", "no adapter_config.json"),
    ("pkg:something", "not a local directory"),
])
def test_what_is_not_an_adapter_in_the_roots_is_refused(tmp_path: Path, source: str, words: str) -> None:
    (tmp_path / "bare").mkdir()
    resolve = weights.adapter_resolver(sourcepaths.Roots.of([tmp_path]))
    text = source.replace("{tmp}", f"file://{tmp_path}")
    with pytest.raises(EngineError) as e:
        resolve(text)
    assert words in str(e.value)
