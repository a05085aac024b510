"""What a weights header says about its model: the pure parsers, on bytes already read.

Two readers use them: the agent, on files in its model directories (memory
mapped; ``llmgw.agent.discovery.weightmeta``), and the control plane, on the
few kilobytes of a remote model it fetches with Range requests before placing
it (``llmgw.control.remotemeta``): the same numbers either way, so a model
estimated before its download is estimated the same after it. Neither side may
import the other, so the parsing lives here and does no I/O.

A GGUF header is walked key by key and tensor info by tensor info, never
touching tensor data; a safetensors model's numbers come from its
``config.json`` and the JSON headers of its ``*.safetensors`` files. Every
parser raises ``BadHeader`` for bytes that end early or hold what no real file
does; callers turn that into "unknown", never into a guess.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from typing import Any

Meta = dict[str, int]

GGUF_MAGIC = b"GGUF"
#: Bounds that a real file stays far inside; past them the file is damaged and
#: reading on would walk (or allocate) through gigabytes of tensor data.
_MAX_COUNT = 1 << 24
_MAX_STRING = 1 << 26
_MAX_DIMS = 8
#: A safetensors JSON header larger than this is not a header.
MAX_SAFETENSORS_HEADER = 1 << 27
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


class BadHeader(Exception):
    """The header ends early or holds something no real file does."""


class _Cursor:
    """Little- or big-endian reads at a moving offset of a buffer; BadHeader past its end."""

    def __init__(self, buf: Any, *, order: str, wide: bool) -> None:
        self.buf, self.pos, self.order = buf, 0, order
        #: GGUF v1 has 32-bit counts and lengths; v2 and v3 have 64-bit ones.
        self.wide = wide

    def scalar(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        except struct.error as exc:
            raise BadHeader("the header ends early") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def count(self) -> int:
        n = int(self.scalar("Q" if self.wide else "I"))
        if n > _MAX_COUNT:
            raise BadHeader(f"a count of {n}")
        return n

    def string(self) -> str:
        n = int(self.scalar("Q" if self.wide else "I"))
        if n > _MAX_STRING or self.pos + n > len(self.buf):
            raise BadHeader(f"a string of {n} bytes")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = int(self.scalar("Q" if self.wide else "I"))
        if n > _MAX_STRING:
            raise BadHeader(f"a string of {n} bytes")
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
            raise BadHeader(f"an array of type {etype}")
        raise BadHeader(f"a value of type {vtype}")


def whole(value: Any) -> int:
    """A positive whole number from a header value (a per-layer list gives its largest), else 0."""
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, int) and not isinstance(v, bool)), default=0)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return 0
    return int(value)


def parse_gguf(buf: Any) -> Meta:
    """The numbers a GGUF header states, from a buffer holding at least the header (BadHeader otherwise).

    A buffer cut inside the header raises BadHeader("the header ends early"): a
    remote reader then asks for more bytes (``llmgw.control.remotemeta``).
    """
    values, params = gguf_values(buf)
    return gguf_numbers(values, params)


def gguf_values(buf: Any) -> tuple[dict[str, Any], int]:
    """A GGUF header's key/value pairs (long arrays and strings of arrays as None) and its parameter count."""
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise BadHeader("no GGUF magic")
    if len(buf) < 8:
        raise BadHeader("the header ends early")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version > 0xFFFF:
        # A big-endian file (s390x builds): the version reads byte-swapped.
        (version,) = struct.unpack_from(">I", buf, 4)
        order = ">"
    if version not in (1, 2, 3):
        raise BadHeader(f"GGUF version {version}")
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
            raise BadHeader(f"a tensor of {n_dims} dimensions")
        params += math.prod(int(cur.scalar("Q" if cur.wide else "I")) for _ in range(n_dims))
        cur.scalar("I")  # the tensor's type
        cur.scalar("Q")  # its offset in the data section
    return values, params


def gguf_numbers(values: dict[str, Any], params: int) -> Meta:
    """``parse_gguf``'s numbers from ``gguf_values``' answer."""
    meta: Meta = {"params": params} if params > 0 else {}
    arch = values.get("general.architecture")
    if isinstance(arch, str) and arch:
        for suffix, field in _GGUF_KEYS.items():
            if number := whole(values.get(f"{arch}.{suffix}")):
                meta[field] = number
    if "head_dim" not in meta and meta.get("hidden_size") and meta.get("heads"):
        meta["head_dim"] = meta["hidden_size"] // meta["heads"]
    if "kv_heads" not in meta and "heads" in meta:
        meta["kv_heads"] = meta["heads"]  # no head_count_kv: every head has its own keys and values
    return meta


def config_numbers(cfg: dict[str, Any]) -> Meta:
    """The numbers of a Hugging Face ``config.json`` (already parsed)."""
    # Multimodal models (Gemma 3, Llama 4, LLaVA) keep the language model's
    # numbers under text_config; the outer document describes the whole.
    text = cfg.get("text_config")
    if "num_hidden_layers" not in cfg and isinstance(text, dict):
        cfg = {**cfg, **text}
    meta: Meta = {}
    for key, field in (("num_hidden_layers", "layers"), ("num_attention_heads", "heads"),
                       ("num_key_value_heads", "kv_heads"), ("hidden_size", "hidden_size"),
                       ("head_dim", "head_dim"), ("max_position_embeddings", "context_length")):
        if number := whole(cfg.get(key)):
            meta[field] = number
    if "head_dim" not in meta and meta.get("hidden_size") and meta.get("heads"):
        meta["head_dim"] = meta["hidden_size"] // meta["heads"]
    if "kv_heads" not in meta and "heads" in meta:
        meta["kv_heads"] = meta["heads"]
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPE_BYTES:
        meta["dtype_bytes"] = DTYPE_BYTES[dtype.removeprefix("torch.")]
    return meta


def safetensors_header_length(first8: bytes) -> int:
    """The JSON header's length from a .safetensors file's first 8 bytes."""
    if len(first8) != 8:
        raise BadHeader("no header length")
    n = int.from_bytes(first8, "little")
    if n > MAX_SAFETENSORS_HEADER:
        raise BadHeader(f"a header of {n} bytes")
    return n


def safetensors_params(raw_header: bytes) -> tuple[int, str]:
    """Elements in one .safetensors file and the dtype most of them have, from its JSON header's bytes."""
    try:
        header = json.loads(raw_header)
    except ValueError as exc:
        raise BadHeader(f"the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise BadHeader("the header is not a mapping")
    params, by_dtype = 0, {}
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise BadHeader(f"tensor {name} has shape {shape!r}")
        count = math.prod(shape)
        params += count
        by_dtype[str(info.get("dtype"))] = by_dtype.get(str(info.get("dtype")), 0) + count
    return params, max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else ""


def safetensors_meta(config: Meta, files: Iterable[tuple[int, str]]) -> Meta:
    """A safetensors model's numbers: ``config``'s, with the parameters (and dtype) of each file's header."""
    meta = dict(config)
    params, dtypes = 0, {}
    for count, dtype in files:
        params += count
        dtypes[dtype] = dtypes.get(dtype, 0) + count
    if params > 0:
        meta["params"] = params
    if "dtype_bytes" not in meta and dtypes:
        # No torch_dtype in config.json: the dtype most elements are stored in.
        main = max(dtypes, key=lambda k: dtypes[k])
        if main in DTYPE_BYTES:
            meta["dtype_bytes"] = DTYPE_BYTES[main]
    return meta
