"""The model file's engine parts: the weights' source, engine_args, env, aliases, dtype and context."""

from __future__ import annotations

import re
from typing import Any

from llmgw.core import engines as engines_mod
from llmgw.core import envpolicy, shards, sources
from llmgw.core.errors import SpecError
from llmgw.core.specfields import choice, mapping, string

ENV_NAME_RE = envpolicy.NAME_RE
#: What ``spec.dtype`` may say. "auto": the engine reads it from the model's config.
DTYPES = ("auto", "float16", "bfloat16", "float32", "fp8")


def parse_source(value: Any, engine: str, *, stored: bool = False) -> str:
    text = string(value, "spec.source").strip()
    if not text:
        found = engines_mod.record(engine)
        if found is not None and found.needs_source:
            raise SpecError("spec.source", f"engine {engine} needs weights: give file:///path/model.gguf "
                                           "or pkg:PACKAGE (a .gguf inside an installed Python package)")
        return ""
    if text.startswith("/"):
        text = "file://" + text
    if text.startswith("file://"):
        if not text[len("file://"):].startswith("/"):
            raise SpecError("spec.source", f"a file source must be an absolute path, got {text!r}")
        if not stored:   # /proc, /sys, /dev refused at apply (core.sources); a stored model loads as it was
            sources.parse(text)
        return text
    if text.startswith("pkg:") and len(text) > 4:
        return text
    # Remote sources (hf://, http(s)://, mirror://) are the fetcher's to read, so one parser
    # says what each means on both sides: what apply accepts, the agent can fetch. Its
    # SourceError is a SpecError on spec.source, saying what to write.
    return sources.parse(text).text


_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")





def parse_source_file(value: Any, source: str) -> str:
    if value is None:
        return ""
    text = string(value, "spec.source_file").strip()
    if not text:
        return ""
    if not source.startswith("hf://"):
        raise SpecError("spec.source_file", "names one file of an hf:// source; for another source name the "
                                            "file in spec.source itself")
    try:
        sources.with_file(sources.parse(source), text)
    except sources.SourceError as exc:
        raise SpecError("spec.source_file", exc.reason) from None
    return text


def parse_source_sha256(value: Any, source: str) -> str:
    if value is None:
        return ""
    text = string(value, "spec.source_sha256").strip().lower()
    if not text:
        return ""
    if not _SHA256_RE.match(text):
        raise SpecError("spec.source_sha256", f"must be 64 hex digits (sha256sum's first word), got {text!r}")
    if not source.startswith(("http://", "https://", "mirror://")):
        raise SpecError("spec.source_sha256", "checks one remote file: give it with an http(s):// or mirror:// "
                                              "source (an hf:// source is checked against the hub's own sums)")
    return text


def parse_engine_args(value: Any, engine: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecError("spec.engine_args", "expected a list of strings, such as [\"--ctx-size\", \"4096\"]")
    args: list[str] = []
    reserved = engines_mod.reserved_flags(engine)
    for i, item in enumerate(value):
        field = f"spec.engine_args[{i}]"
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise SpecError(field, f"expected a string, got {type(item).__name__}")
        text = str(item)
        if "\x00" in text or "\n" in text:
            raise SpecError(field, "must not contain NUL or newline characters")
        flag = text.split("=", 1)[0]
        if flag in reserved:
            raise SpecError(field, f"{flag} is set by llmgw itself for {engine}; remove it from engine_args")
        args.append(text)
    return tuple(args)


def parse_env(value: Any, *, stored: bool = False) -> tuple[tuple[str, str], ...]:
    """The model's env, sorted; a variable llmgw sets or one that would run other code is refused.

    ``stored``: read back from the store, where a model an older version accepted may set
    one of the variables refused since; it reads back (the agent drops it at launch, and
    says so), or listing every model would fail.
    """
    env = mapping(value, "spec.env")
    out: list[tuple[str, str]] = []
    for key, val in env.items():
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise SpecError(f"spec.env.{key}", "not a valid environment variable name")
        refusal = shards.env_refusal(key)
        if refusal is not None and (key in shards.RESERVED_ENV or not stored):
            hint = "; GPUs are given with spec.resources.gpus" if key.startswith("CUDA_") else ""
            raise SpecError(f"spec.env.{key}", f"{refusal}; remove it from env{hint}")
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            raise SpecError(f"spec.env.{key}", "expected a string value")
        out.append((key, str(val)))
    return tuple(sorted(out))


def parse_aliases(value: Any, served: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SpecError("spec.aliases", "expected a list of names, such as [\"smol\", \"gpt-4o-mini\"]")
    out: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip() or any(c.isspace() for c in item):
            raise SpecError(f"spec.aliases[{i}]", "must be a non-empty name without spaces")
        if item == served or item in out:
            raise SpecError(f"spec.aliases[{i}]", f"{item!r} is listed twice (or is the served name)")
        out.append(item)
    return tuple(out)


def parse_dtype(value: Any) -> str:
    if value is None:
        return ""
    text = choice(value, "spec.dtype", DTYPES)
    return "" if text == "auto" else text
