"""The subset of MessagePack that vLLM's KV event batches use, both ways (pure: standard library).

vLLM encodes its ``KVEventBatch`` with ``msgspec.msgpack.Encoder`` (``vllm/distributed/kv_events.py``):
nil, booleans, integers (up to uint64), float64, str, bin, arrays and maps — the spec's
(https://github.com/msgpack/msgpack/blob/master/spec.md) whole type system except ext types, which
a batch never holds. ``encode`` writes the shortest form of each value, as msgspec does, so the sim
engine's batches are byte-for-byte what the engine sends for the same values.
"""

from __future__ import annotations

import struct
from typing import Any


class MsgpackError(ValueError):
    """The bytes are not a MessagePack value this decoder reads."""


def decode(data: bytes) -> Any:
    """The one value ``data`` holds (trailing bytes are an error)."""
    value, end = _read(memoryview(data), 0)
    if end != len(data):
        raise MsgpackError(f"{len(data) - end} bytes after the value")
    return value


def _read(b: memoryview, i: int) -> tuple[Any, int]:  # noqa: C901 - one branch per type byte
    try:
        t = b[i]
        i += 1
        if t <= 0x7F:
            return t, i
        if t >= 0xE0:
            return t - 0x100, i
        if 0x80 <= t <= 0x8F:
            return _map(b, i, t & 0x0F)
        if 0x90 <= t <= 0x9F:
            return _array(b, i, t & 0x0F)
        if 0xA0 <= t <= 0xBF:
            n = t & 0x1F
            return str(b[i:i + n], "utf-8"), i + n
        if t == 0xC0:
            return None, i
        if t in (0xC2, 0xC3):
            return t == 0xC3, i
        if t in (0xC4, 0xC5, 0xC6):
            n, i = _uint(b, i, 1 << (t - 0xC4))
            return bytes(b[i:i + n]), i + n
        if t == 0xCA:
            return struct.unpack_from(">f", b, i)[0], i + 4
        if t == 0xCB:
            return struct.unpack_from(">d", b, i)[0], i + 8
        if 0xCC <= t <= 0xCF:
            return _uint(b, i, 1 << (t - 0xCC))
        if 0xD0 <= t <= 0xD3:
            size = 1 << (t - 0xD0)
            v = int.from_bytes(b[i:i + size], "big", signed=True)
            return v, i + size
        if t in (0xD9, 0xDA, 0xDB):
            n, i = _uint(b, i, 1 << (t - 0xD9))
            return str(b[i:i + n], "utf-8"), i + n
        if t in (0xDC, 0xDD):
            n, i = _uint(b, i, 2 if t == 0xDC else 4)
            return _array(b, i, n)
        if t in (0xDE, 0xDF):
            n, i = _uint(b, i, 2 if t == 0xDE else 4)
            return _map(b, i, n)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MsgpackError(f"truncated or malformed value at byte {i}") from exc
    raise MsgpackError(f"type byte 0x{t:02x} (ext or reserved) at byte {i - 1}")


def _uint(b: memoryview, i: int, size: int) -> tuple[int, int]:
    if i + size > len(b):
        raise MsgpackError(f"truncated integer at byte {i}")
    return int.from_bytes(b[i:i + size], "big"), i + size


def _array(b: memoryview, i: int, n: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(n):
        v, i = _read(b, i)
        out.append(v)
    return out, i


def _map(b: memoryview, i: int, n: int) -> tuple[dict[Any, Any], int]:
    out = {}
    for _ in range(n):
        k, i = _read(b, i)
        v, i = _read(b, i)
        out[k] = v
    return out, i


def encode(value: Any) -> bytes:
    out = bytearray()
    _write(value, out)
    return bytes(out)


def _write(v: Any, out: bytearray) -> None:  # noqa: C901 - one branch per type
    if v is None:
        out.append(0xC0)
    elif v is True or v is False:
        out.append(0xC3 if v else 0xC2)
    elif isinstance(v, int):
        _int(v, out)
    elif isinstance(v, float):
        out.append(0xCB)
        out += struct.pack(">d", v)
    elif isinstance(v, str):
        raw = v.encode("utf-8")
        n = len(raw)
        if n < 32:
            out.append(0xA0 | n)
        else:
            _sized(n, out, 0xD9, 0xDA, 0xDB)
        out += raw
    elif isinstance(v, (bytes, bytearray)):
        _sized(len(v), out, 0xC4, 0xC5, 0xC6)
        out += v
    elif isinstance(v, (list, tuple)):
        if len(v) < 16:
            out.append(0x90 | len(v))
        else:
            _sized(len(v), out, None, 0xDC, 0xDD)
        for item in v:
            _write(item, out)
    elif isinstance(v, dict):
        if len(v) < 16:
            out.append(0x80 | len(v))
        else:
            _sized(len(v), out, None, 0xDE, 0xDF)
        for k, item in v.items():
            _write(k, out)
            _write(item, out)
    else:
        raise TypeError(f"cannot MessagePack-encode a {type(v).__name__}")


def _sized(n: int, out: bytearray, t8: int | None, t16: int, t32: int) -> None:
    if t8 is not None and n < 1 << 8:
        out += bytes((t8, n))
    elif n < 1 << 16:
        out.append(t16)
        out += struct.pack(">H", n)
    else:
        out.append(t32)
        out += struct.pack(">I", n)


def _int(v: int, out: bytearray) -> None:
    if 0 <= v <= 0x7F or -32 <= v < 0:
        out.append(v & 0xFF)
    elif v >= 0:
        for t, size in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
            if v < 1 << (8 * size):
                out.append(t)
                out += v.to_bytes(size, "big")
                return
        raise ValueError("integer past uint64")
    else:
        for t, size in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
            if v >= -(1 << (8 * size - 1)):
                out.append(t)
                out += v.to_bytes(size, "big", signed=True)
                return
        raise ValueError("integer past int64")
