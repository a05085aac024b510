"""Shard ids: exactly what the control plane names a shard, and never anything that names another file."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.core import shards
from llmgw.core.errors import ShardIdError

LONGEST_MODEL = "m" + "x" * 61 + "z"  # 63 characters, the most specs.NAME_RE allows

GENERATED = [
    "r1-1",
    "llama-3.1-8b-1a2b3c-2",  # <model>-<hex>-<attempt>
    "qwen2.5-coder-0a0b0c-12-1",  # a replica spanning nodes: -<rank>
    "a..b-abcdef-1",  # specs.NAME_RE lets a model be named "a..b"
    f"{LONGEST_MODEL}-abcdef-{10**9}-7",
]

BAD = {
    "/var/log/dpkg": "path separator",
    "../../../etc/passwd": "path separator",
    "..": "starts with '.'",
    ".": "starts with '.'",
    ".hidden": "starts with '.'",
    "a/../../b": "path separator",
    "a\\b": "path separator",
    "": "empty",
    "a\0b": "NUL",
    "-rf": "starts with '-'",
    "x" * 129: "129 characters long, over 128",
    "Model-1": "contains 'M'",
    "a_b": "contains '_'",
    "a b": "contains ' '",
    "caf\u00e9-1": "contains 'é'",
    "a\nb": "contains '\\n'",
}


@pytest.mark.parametrize("shard_id", GENERATED)
def test_ids_the_control_plane_generates_are_accepted(shard_id: str) -> None:
    """Every shape the control plane names a shard is accepted and returned as it is."""
    assert shards.check_shard_id(shard_id) == shard_id


@pytest.mark.parametrize(("shard_id", "problem"), BAD.items(), ids=[repr(k[:20]) for k in BAD])
def test_a_bad_id_is_refused_saying_what_was_wrong_and_what_one_looks_like(shard_id: str, problem: str) -> None:
    """A traversal, an empty, NUL, dash-led, over-long or foreign-character id is refused with the reason."""
    with pytest.raises(ShardIdError) as got:
        shards.check_shard_id(shard_id)
    message = str(got.value)
    assert problem in message
    assert "lower-case letters, digits, '.' and '-'" in message and "at most 128" in message
    assert "llama-3.1-8b-1a2b3c-2" in message  # an example of a good one


def test_a_very_long_id_is_shortened_in_the_message() -> None:
    """A megabyte of id does not come back as a megabyte of error message."""
    with pytest.raises(ShardIdError) as got:
        shards.check_shard_id("a" * 1_000_000)
    assert len(str(got.value)) < 1000 and "1000000 characters" in str(got.value)


def test_every_accepted_id_is_one_file_name_inside_the_run_dir(tmp_path: Path) -> None:
    """Of generated, bad and tricky candidates, each accepted one makes `<run_dir>/<id>.log` a file in run_dir."""
    run_dir = tmp_path / "node" / "shards"
    tricky = ["a..", "a.", "a-", "0", "a..-..b", "a...log", "1.2.3"]
    accepted = []
    for shard_id in [*GENERATED, *BAD, *tricky]:
        try:
            shards.check_shard_id(shard_id)
        except ShardIdError:
            continue
        accepted.append(shard_id)
        for suffix in (".log", ".json"):
            assert (run_dir / f"{shard_id}{suffix}").resolve().parent == run_dir.resolve(), shard_id
    assert accepted == [*GENERATED, *tricky]
