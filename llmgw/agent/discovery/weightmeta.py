"""What a weight file says about its model: layers, heads, context, parameters, dtype.

Placement estimates a replica's memory from these when the model file states
none (``llmgw.core.estimate``), so they are read where the weights are, by the
agent, and sent with the inventory.

A ``.gguf`` file's header is parsed here rather than with ``gguf.GGUFReader``:
the reader builds numpy arrays for every key, the tokenizer's 150,000-entry
vocabulary included, and indexes every tensor, when only a dozen numbers and
the tensor shapes are wanted. This parser walks the key/value section and the
tensor infos of a memory map and never touches tensor data, so a 40 GB file
costs the pages of its header. A safetensors directory's numbers come from its
``config.json`` and the JSON headers of its ``*.safetensors`` files (the
parameter count is summed from the tensor shapes there).

Every reader answers a mapping of ``WeightFile`` field names to numbers and
leaves out what it cannot tell: a truncated download, a file that is not what
its name says, or a format this version does not know gives an empty mapping,
never an exception, because one bad file must not hide the good ones beside it.
Results are cached by path, size and modification time: the weights are
rescanned every few minutes, and a file that has not changed is not read again.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

from llmgw.core import weightmeta as core_meta

log = logging.getLogger(__name__)

# The parsers are pure and shared with the control plane's remote reader, which may not
# import the agent: they live in ``llmgw.core.weightmeta``; these names stay for callers here.
Meta = core_meta.Meta
GGUF_MAGIC = core_meta.GGUF_MAGIC
DTYPE_BYTES = core_meta.DTYPE_BYTES
_Bad = core_meta.BadHeader
_parse_gguf = core_meta.parse_gguf
_CACHE_MAX = 4096
_cache: dict[tuple[str, int, int], Meta] = {}


def gguf(path: str | Path) -> Meta:
    """The numbers a .gguf file's header states; {} when it cannot be read as one."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_gguf(buf)
    except (OSError, ValueError, _Bad, struct.error) as exc:
        # ValueError: mmap of an empty file.
        log.info("cannot read the GGUF header of %s (%s); its model's memory is not estimated", path, exc)
        return {}


def _safetensors_params(path: Path) -> tuple[int, str]:
    """Elements in one .safetensors file and the dtype most of them have, from its JSON header."""
    with open(path, "rb") as f:
        n = core_meta.safetensors_header_length(f.read(8))
        return core_meta.safetensors_params(f.read(n))


def safetensors(directory: str | Path, files: Iterable[str]) -> Meta:
    """The numbers of a safetensors model directory: config.json's, and the tensors' element count."""
    directory = Path(directory)
    config: Meta = {}
    try:
        cfg = json.loads((directory / "config.json").read_bytes())
        if isinstance(cfg, dict):
            config = core_meta.config_numbers(cfg)
    except (OSError, ValueError) as exc:
        log.info("cannot read %s/config.json (%s); its model's memory is not estimated", directory, exc)
    try:
        headers = [_safetensors_params(directory / name) for name in sorted(files)]
    except (OSError, ValueError, _Bad) as exc:
        # One shard still downloading makes the sum wrong, so there is none.
        log.info("cannot read the safetensors headers in %s (%s); its parameter count is unknown", directory, exc)
        return config
    return core_meta.safetensors_meta(config, headers)


def cached(key_path: str, stat_of: Iterable[str], read: Callable[[], Meta]) -> Meta:
    """``read()``, or its earlier answer while ``stat_of``'s files keep their sizes and times."""
    try:
        stats = [os.stat(p) for p in stat_of]
    except OSError:
        return {}
    key = (key_path, sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0))
    if key in _cache:
        return _cache[key]
    meta = read()
    if len(_cache) >= _CACHE_MAX:
        _cache.pop(next(iter(_cache)))  # the oldest entry
    _cache[key] = meta
    return meta
