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
import math
import mmap
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Meta = dict[str, int]

GGUF_MAGIC = b"GGUF"
#: Bounds that a real file stays far inside; past them the file is damaged and
#: reading on would walk (or allocate) through gigabytes of tensor data.
_MAX_COUNT = 1 << 24
_MAX_STRING = 1 << 26
_MAX_DIMS = 8
#: A safetensors JSON header larger than this is not a header.
_MAX_ST_HEADER = 1 << 27
#: Fixed sizes of GGUF's scalar value types, by type code.
_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
#: Bytes per element of the dtypes config.json and safetensors headers name.
DTYPE_BYTES = {
    "float32": 4, "float": 4, "F32": 4, "float16": 2, "half": 2, "F16": 2, "bfloat16": 2, "BF16": 2,
    "float64": 8, "F64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "int8": 1, "I8": 1, "uint8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1,
}
#: The arch-prefixed GGUF keys read, and the WeightFile field each fills.
_GGUF_KEYS = {"block_count": "layers", "embedding_length": "hidden_size", "attention.head_count": "heads",
              "attention.head_count_kv": "kv_heads", "context_length": "context_length",
              "attention.key_length": "head_dim"}
_CACHE_MAX = 4096
_cache: dict[tuple[str, int, int], Meta] = {}


class _Bad(Exception):
    """The header ends early or holds something no real file does."""


class _Cursor:
    """Little- or big-endian reads at a moving offset of a buffer; _Bad past its end."""

    def __init__(self, buf: Any, *, order: str, wide: bool) -> None:
        self.buf, self.pos, self.order = buf, 0, order
        #: GGUF v1 has 32-bit counts and lengths; v2 and v3 have 64-bit ones.
        self.wide = wide

    def scalar(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        except struct.error as exc:
            raise _Bad("the header ends early") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def count(self) -> int:
        n = int(self.scalar("Q" if self.wide else "I"))
        if n > _MAX_COUNT:
            raise _Bad(f"a count of {n}")
        return n

    def string(self) -> str:
        n = int(self.scalar("Q" if self.wide else "I"))
        if n > _MAX_STRING or self.pos + n > len(self.buf):
            raise _Bad(f"a string of {n} bytes")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = int(self.scalar("Q" if self.wide else "I"))
        if n > _MAX_STRING:
            raise _Bad(f"a string of {n} bytes")
        self.pos += n

    def value(self, vtype: int) -> Any:
        """One value of GGUF type ``vtype``; an array's numbers come back as a list, its strings are skipped."""
        if vtype in _GGUF_FORMATS:
            return self.scalar(_GGUF_FORMATS[vtype])
        if vtype == _GGUF_STRING:
            return self.string()
        if vtype == _GGUF_ARRAY:
            etype, n = int(self.scalar("I")), self.count()
            if etype in _GGUF_SCALARS:
                if n > 4096:  # a long numeric array (token scores): skipped, nobody here needs it
                    self.pos += n * _GGUF_SCALARS[etype]
                    return None
                return [self.scalar(_GGUF_FORMATS[etype]) for _ in range(n)]
            if etype == _GGUF_STRING:
                for _ in range(n):  # the vocabulary: each string's length must be read to pass it
                    self.skip_string()
                return None
            raise _Bad(f"an array of type {etype}")
        raise _Bad(f"a value of type {vtype}")


def _whole(value: Any) -> int:
    """A positive whole number from a header value (a per-layer list gives its largest), else 0."""
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, int) and not isinstance(v, bool)), default=0)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return 0
    return int(value)


def _parse_gguf(buf: Any) -> Meta:
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise _Bad("no GGUF magic")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version > 0xFFFF:
        # A big-endian file (s390x builds): the version reads byte-swapped.
        (version,) = struct.unpack_from(">I", buf, 4)
        order = ">"
    if version not in (1, 2, 3):
        raise _Bad(f"GGUF version {version}")
    cur = _Cursor(buf, order=order, wide=version >= 2)
    cur.pos = 8
    n_tensors, n_kv = cur.count(), cur.count()
    values: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        values[key] = cur.value(int(cur.scalar("I")))
    params = 0
    for _ in range(n_tensors):
        cur.skip_string()
        n_dims = int(cur.scalar("I"))
        if n_dims > _MAX_DIMS:
            raise _Bad(f"a tensor of {n_dims} dimensions")
        params += math.prod(int(cur.scalar("Q" if cur.wide else "I")) for _ in range(n_dims))
        cur.scalar("I")  # the tensor's type
        cur.scalar("Q")  # its offset in the data section
    meta: Meta = {"params": params} if params > 0 else {}
    arch = values.get("general.architecture")
    if isinstance(arch, str) and arch:
        for suffix, field in _GGUF_KEYS.items():
            if number := _whole(values.get(f"{arch}.{suffix}")):
                meta[field] = number
    if "head_dim" not in meta and meta.get("hidden_size") and meta.get("heads"):
        meta["head_dim"] = meta["hidden_size"] // meta["heads"]
    if "kv_heads" not in meta and "heads" in meta:
        meta["kv_heads"] = meta["heads"]  # no head_count_kv: every head has its own keys and values
    return meta


def gguf(path: str | Path) -> Meta:
    """The numbers a .gguf file's header states; {} when it cannot be read as one."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse_gguf(buf)
    except (OSError, ValueError, _Bad, struct.error) as exc:
        # ValueError: mmap of an empty file.
        log.info("cannot read the GGUF header of %s (%s); its model's memory is not estimated", path, exc)
        return {}


def _config_numbers(cfg: dict[str, Any]) -> Meta:
    # Multimodal models (Gemma 3, Llama 4, LLaVA) keep the language model's
    # numbers under text_config; the outer document describes the whole.
    text = cfg.get("text_config")
    if "num_hidden_layers" not in cfg and isinstance(text, dict):
        cfg = {**cfg, **text}
    meta: Meta = {}
    for key, field in (("num_hidden_layers", "layers"), ("num_attention_heads", "heads"),
                       ("num_key_value_heads", "kv_heads"), ("hidden_size", "hidden_size"),
                       ("head_dim", "head_dim"), ("max_position_embeddings", "context_length")):
        if number := _whole(cfg.get(key)):
            meta[field] = number
    if "head_dim" not in meta and meta.get("hidden_size") and meta.get("heads"):
        meta["head_dim"] = meta["hidden_size"] // meta["heads"]
    if "kv_heads" not in meta and "heads" in meta:
        meta["kv_heads"] = meta["heads"]
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPE_BYTES:
        meta["dtype_bytes"] = DTYPE_BYTES[dtype.removeprefix("torch.")]
    return meta


def _safetensors_params(path: Path) -> tuple[int, str]:
    """Elements in one .safetensors file and the dtype most of them have, from its JSON header."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise _Bad("no header length")
        n = int.from_bytes(raw, "little")
        if n > _MAX_ST_HEADER:
            raise _Bad(f"a header of {n} bytes")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise _Bad("the header is not a mapping")
    params, by_dtype = 0, {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise _Bad(f"tensor {name} has shape {shape!r}")
        count = math.prod(shape)
        params += count
        by_dtype[str(info.get("dtype"))] = by_dtype.get(str(info.get("dtype")), 0) + count
    return params, max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else ""


def safetensors(directory: str | Path, files: Iterable[str]) -> Meta:
    """The numbers of a safetensors model directory: config.json's, and the tensors' element count."""
    directory = Path(directory)
    meta: Meta = {}
    try:
        cfg = json.loads((directory / "config.json").read_bytes())
        if isinstance(cfg, dict):
            meta.update(_config_numbers(cfg))
    except (OSError, ValueError) as exc:
        log.info("cannot read %s/config.json (%s); its model's memory is not estimated", directory, exc)
    params, dtypes = 0, {}
    try:
        for name in sorted(files):
            count, dtype = _safetensors_params(directory / name)
            params += count
            dtypes[dtype] = dtypes.get(dtype, 0) + count
    except (OSError, ValueError, _Bad) as exc:
        # One shard still downloading makes the sum wrong, so there is none.
        log.info("cannot read the safetensors headers in %s (%s); its parameter count is unknown", directory, exc)
        return meta
    if params > 0:
        meta["params"] = params
    if "dtype_bytes" not in meta and dtypes:
        # No torch_dtype in config.json: the dtype most elements are stored in.
        main = max(dtypes, key=lambda k: dtypes[k])
        if main in DTYPE_BYTES:
            meta["dtype_bytes"] = DTYPE_BYTES[main]
    return meta


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
