"""The model file's field readers: each checks one value's type and range and names the field when it refuses."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from llmgw.core.errors import SpecError


def check_fields(doc: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in doc:
        if key not in known:
            path = f"{where}.{key}" if where else str(key)
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known fields: {', '.join(known)}"
            raise SpecError(path, f"unknown field{hint}")


def mapping(value: Any, field: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping, got {type(value).__name__}")
    return value


def string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {type(value).__name__}")
    return value


def integer(value: Any, field: str, *, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"expected a whole number, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(field, f"must be between {lo} and {hi}, got {value}")
    return value


def choice(value: Any, field: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise SpecError(field, f"unknown value {value!r}; one of: {', '.join(choices)}")
    return str(value)


def or_zero(value: Any) -> Any:
    return 0 if value is None else value  # a YAML "key:" with nothing after it is null: not set


def header(doc: Any, *, kind: str, api_version: str, meta_fields: tuple[str, ...]) -> Mapping[str, Any]:
    """A manifest's header checked (a mapping of apiVersion, kind, metadata and spec; its kind ``kind``) and its
    metadata, checked against ``meta_fields``; SpecError naming the field."""
    if not isinstance(doc, Mapping):
        raise SpecError("", f"a {kind.lower()} file must be a mapping with apiVersion, kind, metadata and spec")
    check_fields(doc, ("apiVersion", "kind", "metadata", "spec"), "")
    if doc.get("apiVersion") != api_version:
        raise SpecError("apiVersion", f"must be {api_version!r}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != kind:
        raise SpecError("kind", f"must be {kind!r}, got {doc.get('kind')!r}")
    meta = mapping(doc.get("metadata"), "metadata")
    check_fields(meta, meta_fields, "metadata")
    return meta
