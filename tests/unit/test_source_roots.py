"""A file source resolves only under the node's source roots, refused before any byte of it is opened."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from llmgw.agent import sourcepaths, weights
from llmgw.core import errors, sources, specs

#: Paths Python opened, recorded by an audit hook (``open`` events: builtins.open, os.open, io.open).
_OPENED: list[str] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        _OPENED.append(os.fsdecode(args[0]))  # type: ignore[arg-type]


sys.addaudithook(_audit)


def _roots(*dirs: Path) -> sourcepaths.Roots:
    return sourcepaths.Roots.of(dirs)


def test_a_file_outside_every_root_is_refused_with_the_setting_and_nothing_opened(tmp_path: Path) -> None:
    """/etc/shadow-like: refused naming the roots and source_roots; its bytes are never opened or echoed."""
    weights_dir = tmp_path / "weights"
    weights_dir.mkdir()
    secret = tmp_path / "ca.key"
    secret.write_text("-----BEGIN PRIVATE KEY----- s3cr3t")
    _OPENED.clear()
    with pytest.raises(errors.EngineError) as refused:
        weights.resolve_source(f"file://{secret}", roots=_roots(weights_dir))
    assert str(refused.value) == (f"spec.source {secret} is outside this node's source roots ({weights_dir}); put "
                                  "the weights under one, or add a root to source_roots in the agent's settings")
    assert "s3cr3t" not in str(refused.value)
    assert str(secret) not in _OPENED
    # A missing file outside is refused with the same sentence: existence is not told either.
    with pytest.raises(errors.EngineError, match="outside this node's source roots"):
        weights.resolve_source(f"file://{tmp_path / 'absent.gguf'}", roots=_roots(weights_dir))


def test_etc_shadow_and_proc_are_refused_by_the_agent(tmp_path: Path) -> None:
    """The issue's three paths, as the node sees them (the agent's check does not rely on the apply-time one)."""
    for path in ("/etc/shadow", "/proc/self/environ", "/etc/../etc/passwd"):
        _OPENED.clear()
        with pytest.raises(errors.EngineError, match="outside this node's source roots"):
            weights.resolve_source(f"file://{path}", roots=_roots(tmp_path))
        assert not [p for p in _OPENED if p.startswith(("/etc", "/proc"))]


def test_symlinks_and_dotdot_out_of_a_root_are_refused_and_inside_is_resolved(tmp_path: Path) -> None:
    """A link inside a root pointing out, and ``..`` climbing out, are judged by where they lead."""
    root = tmp_path / "weights"
    root.mkdir()
    outside = tmp_path / "private.gguf"
    outside.write_bytes(b"GGUF private")
    (root / "link.gguf").symlink_to(outside)
    for source in (f"file://{root / 'link.gguf'}", f"file://{root}/../private.gguf"):
        with pytest.raises(errors.EngineError, match="outside this node's source roots"):
            weights.resolve_source(source, roots=_roots(root))
    model = root / "sub" / "m.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    assert weights.resolve_source(f"file://{model}", roots=_roots(root)) == str(model)
    # A root that is itself a symlink (/models -> /lustre/models) holds what its target holds.
    linked_root = tmp_path / "models"
    linked_root.symlink_to(root)
    assert weights.resolve_source(f"file://{model}", roots=_roots(linked_root)) == str(model)
    # An extra root (source_roots) is a root too.
    assert weights.resolver(sourcepaths.Roots.of([root], [tmp_path]))(f"file://{outside}") == str(outside)


def test_apply_refuses_proc_sys_and_dev_with_the_sentence() -> None:
    """What no node allows is refused at apply already (after '..' is folded); other paths are the node's call."""
    for src in ("/proc/self/environ", "file:///sys/kernel/x", "file:///dev/../proc/1/environ", "file:///dev/sda"):
        with pytest.raises(sources.SourceError, match="where no weights are kept"):
            specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                                  "spec": {"engine": "llamacpp", "source": src}})
    assert sources.parse("/models/x.gguf").path == "/models/x.gguf"


def test_the_settings_read_source_roots_and_fetch_allow_private_from_the_environment(tmp_path: Path) -> None:
    """LLMGW_AGENT_SOURCE_ROOTS is a comma list of absolute paths; FETCH_ALLOW_PRIVATE is true, false or hosts."""
    from llmgw.agent import settings, settingsload

    def load(env: dict[str, str]) -> settings.AgentSettings:
        return settingsload.load(path=None, env={"LLMGW_AGENT_SERVER": "cp:8081", **env}, flags={})

    st = load({"LLMGW_AGENT_SOURCE_ROOTS": f"{tmp_path}/a, {tmp_path}/b",
               "LLMGW_AGENT_FETCH_ALLOW_PRIVATE": "127.0.0.1:9000,mirror.local"})
    assert st.source_roots == [tmp_path / "a", tmp_path / "b"]
    assert st.fetch_allow_private == ["127.0.0.1:9000", "mirror.local"]
    assert load({"LLMGW_AGENT_FETCH_ALLOW_PRIVATE": "true"}).fetch_allow_private is True
    assert load({}).fetch_allow_private is False and load({}).source_roots == []
    with pytest.raises(settings.SettingsError, match="LLMGW_AGENT_SOURCE_ROOTS.*absolute"):
        load({"LLMGW_AGENT_SOURCE_ROOTS": "relative/dir"})
