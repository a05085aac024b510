"""The mirror's one path validator: what it lets through and what it refuses, with which status."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.mirror import paths


@pytest.mark.parametrize("text", ["../x", "a/../../x", "a/./b", "a//b", "/etc/passwd", "a\\..\\b", "a\x00b", "", ".."])
def test_relative_refuses_paths_that_could_leave(text: str) -> None:
    """'..', '.', empty segments, absolute paths, backslashes and NULs are refused with 400 and a sentence."""
    with pytest.raises(paths.PathRefused) as e:
        paths.relative(text)
    assert e.value.status == 400 and "path" in e.value.message


@pytest.mark.parametrize("text", ["config.json", "sub/dir/model.safetensors", "a..b/c", ".hidden/x"])
def test_relative_accepts_plain_paths(text: str) -> None:
    """Plain relative paths (dots inside a name included) pass unchanged."""
    assert paths.relative(text) == text


@pytest.mark.parametrize("name", ["..", ".", "a/b", "", "-x", "x.", "a..b", "x" * 97])
def test_segment_refuses_names_that_are_not_one_plain_segment(name: str) -> None:
    """An org, repo, branch or mirror name must be one plain segment."""
    with pytest.raises(paths.PathRefused) as e:
        paths.segment(name, "the name")
    assert e.value.status == 400 and "letters, digits" in e.value.message


def test_inside_refuses_symlinks_out_of_the_root(tmp_path: Path) -> None:
    """A symlink under the root that points outside it is refused with 404; one that stays inside is followed."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (tmp_path / "secret").write_text("s")
    (root / "d" / "real").write_text("r")
    (root / "out").symlink_to(tmp_path / "secret")
    (root / "outdir").symlink_to(tmp_path)
    (root / "in").symlink_to(root / "d" / "real")
    for rel in ("out", "outdir/secret"):
        with pytest.raises(paths.PathRefused) as e:
            paths.inside(root, rel)
        assert e.value.status == 404 and "outside" in e.value.message
    assert paths.inside(root, "in") == (root / "d" / "real").resolve()
    assert paths.inside(root, "d/missing") == (root / "d" / "missing").resolve()
