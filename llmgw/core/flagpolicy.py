"""Engine flags that run or load code a model file names, refused unless an admin allows remote code.

``engine_args: ["--trust-remote-code"]`` with an ``hf://`` repository of the operator's choosing is, by
vLLM's design, that repository's Python running on every node the model is placed on (issue 24). The
same holds for a plugin file (``--tool-parser-plugin``), a class imported by name (``--worker-cls``), a
request-supplied pickle (SGLang's ``--enable-custom-logit-processor``), and, for reading or writing
files outside the weights llmgw fetched, a template or TLS file from any path. Each engine's record
(``llmgw.core.engines``, ``code_flags``) lists them, from the engine's own parser; an admin allows them
for the whole cluster with ``llmgw settings set allow_remote_code true`` (audited).

Matched as the engine's parser would: ``--flag=value`` as ``--flag``, underscores as dashes (vLLM takes
``--trust_remote_code``), and, where the parser takes abbreviations (argparse's ``allow_abbrev``, kept by
vLLM and SGLang), any prefix of a code flag (``--trust-remote`` is ``--trust-remote-code`` to argparse)
unless the prefix is itself a safe flag of the engine (``safe_prefix_flags``).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.core import engines

#: What lifts the refusal, said in every refusal.
ALLOW_HINT = "an admin may allow it for the whole cluster with `llmgw settings set allow_remote_code true`"


def _flag(arg: str) -> str:
    flag = arg.split("=", 1)[0]
    return flag.replace("_", "-") if flag.startswith("--") else flag


def code_flag_of(engine: str, arg: str) -> str | None:
    """The code flag ``arg`` sets for ``engine`` (itself, or the flag it abbreviates); None if none."""
    rec = engines.record(engine)
    if rec is None or not arg.startswith("-"):
        return None
    flag = _flag(arg)
    if flag in rec.code_flags:
        return flag
    if not (rec.takes_abbreviations and flag.startswith("--") and len(flag) > 3):
        return None
    if flag in rec.safe_prefix_flags:
        return None
    matches = sorted(c for c in rec.code_flags if c.startswith(flag))
    return matches[0] if matches else None


def refusals(engine: str, args: Sequence[str], *, allow_remote_code: bool = False) -> list[tuple[int, str]]:
    """``(index, sentence)`` for each arg that makes ``engine`` run or load code; none when an admin allows it."""
    if allow_remote_code:
        return []
    rec = engines.record(engine)
    safe_values = dict(rec.code_flag_safe_values) if rec is not None else {}
    out: list[tuple[int, str]] = []
    for i, arg in enumerate(args):
        flag = code_flag_of(engine, arg)
        if flag is None:
            continue
        _, eq, value = arg.partition("=")
        if not eq and i + 1 < len(args):
            value = args[i + 1]
        if flag in safe_values and value in safe_values[flag]:
            continue
        said = arg.split("=", 1)[0]
        named = said if _flag(said) == flag else f"{said} (which {engine} reads as {flag})"
        out.append((i, f"{named} makes {engine} run or load code, or read or write a file, that the model file "
                       f"names (on every node the model is placed on); llmgw refuses it; {ALLOW_HINT}"))
    return out
