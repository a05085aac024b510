"""What a reader of a file still being pulled may send: never its last byte before the download is verified."""

from __future__ import annotations

from pathlib import Path

from llmgw.mirror import pull, store


def test_last_byte_waits_for_verification(tmp_path: Path) -> None:
    """Until verified, a reader may send all but the last byte, so a corrupt download never looks complete."""
    p = pull.Pull(store.Entry("w.bin", 10, "f" * 64), tmp_path / "tmp", tmp_path / "final")
    p.done = 4
    assert p.available() == 4
    p.done = 10
    assert p.available() == 9
    p.verified = True
    assert p.available() == 10
