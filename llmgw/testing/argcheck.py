"""Parse an adapter's argv with an engine's own flags, rebuilt from a fixture the engine's parser wrote.

An adapter's argv that the engine refuses fails minutes after placement on a node nobody watches. SGLang's
parser needs an 11 GB CUDA install, so ``scripts/engine_flags.py`` dumps its real argparse parser to JSON
(``llmgw/testing/engineflags/``, provenance in SOURCE.md) and the tests parse argv against that record here.

Rebuilt honestly: an unknown flag, a bad choice, a non-integer given to an integer flag, a flag without its
value and a missing required flag all raise ``ArgvRefused`` (a ValueError) naming the flag, where the engine
would print usage and exit 2. Two differences, both stricter than the engine:

- Abbreviations are refused. The engines' parsers take any unique prefix: SGLang 0.5.23 has no ``--tp``
  and reads it as ``--tp-size`` (its own docs write ``--tp 16``); an adapter that relied on that would break
  the day the engine adds another flag starting ``--tp``.
- Deprecated flags are refused unless ``allow_deprecated=True``: the engine warns today and removes the
  flag in a later release (SGLang's ``DeprecatedAction`` already stops the launch).

What the record cannot carry: a type the fixture names ``other:<function>`` (a parser of the engine's own,
such as vLLM's JSON-to-dataclass config flags) is kept as the string given, unchecked; and a custom
action's ``__call__`` (SGLang's ``--lora-paths`` splitting JSON) is not replayed, the raw values are stored.
vLLM's FlexibleArgumentParser rewrites argv before parsing (``--foo_bar`` to ``--foo-bar``, ``--config``
YAML, ``-O3``); none of that is replayed either, so write argv in the canonical ``--foo-bar value`` form.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "engineflags"


class ArgvRefused(ValueError):
    """The engine's parser, as recorded in the fixture, would refuse this argv."""

    def __init__(self, fixture: str, problem: str, argv: Sequence[str]) -> None:
        self.fixture = fixture
        self.problem = problem
        super().__init__(
            f"{fixture} refuses the argv: {problem}; fix the adapter's flags (argv: {' '.join(argv)})"
        )


class _Problem(Exception):
    """Raised from the rebuilt parser instead of printing usage and exiting."""


class _RecordedParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse calls this for every refusal, even with exit_on_error=False
        raise _Problem(message)


def fixture_path(path_or_name: str | Path) -> Path:
    """A fixture by path, or by name in llmgw/testing/engineflags ("sglang-0.5.23" or "sglang-0.5.23.json")."""
    path = Path(path_or_name)
    if path.exists():
        return path
    name = path.name if path.name.endswith(".json") else f"{path.name}.json"
    found = FIXTURES / name
    if not found.exists():
        have = sorted(p.stem for p in FIXTURES.glob("*.json"))
        raise FileNotFoundError(
            f"no engine flags fixture {path_or_name!r}; have {have}; make one with scripts/engine_flags.py"
        )
    return found


def load_fixture(path_or_name: str | Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(fixture_path(path_or_name).read_text())
    return record


def _optional(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    # vLLM's optional_type: "" and "None" mean None, anything else must parse as the inner type.
    def optional(value: str) -> Any:
        return None if value in ("", "None") else inner(value)

    optional.__name__ = getattr(inner, "__name__", "value")
    return optional


def _json(value: str) -> Any:
    return json.loads(value)


def _nullable_str(value: str) -> str | None:
    return None if not value or value == "None" else value


def _json_or_str(value: str) -> Any:
    # vLLM's union_dict_and_str: a {...} value is JSON, anything else a plain string.
    if not re.match(r"(?s)^\s*{.*}\s*$", value):
        return value
    return None if value in ("", "None") else json.loads(value)


def _human_int_sglang(value: str) -> int:
    # sglang.srt.utils.common.human_readable_int: SI k/M/G/T (decimals allowed), IEC Ki/Mi/Gi/Ti (integers).
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    if suffix.endswith("i"):
        return int(number) * 2 ** (10 * ("KMGT".index(suffix[0]) + 1))
    return int(Decimal(number) * 10 ** (3 * ("kMGT".index(suffix) + 1)))


def _human_int_vllm(value: str) -> int:
    # vllm.utils.argparse_utils.human_readable_int: lower case is decimal, upper case binary (integers only).
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if not match:
        return int(value)
    number, suffix = match.groups()
    power = "KMGT".index(suffix.upper()) + 1
    if suffix.islower():
        return int(float(number) * 10 ** (3 * power))
    return int(number) * 2 ** (10 * power)


def _human_int_or_auto_vllm(value: str) -> int:
    return -1 if value.strip() in ("-1",) or value.strip().lower() == "auto" else _human_int_vllm(value)


_human_int_sglang.__name__ = _human_int_vllm.__name__ = "human_readable_int"

TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "json": _json,
    "nullable_str": _nullable_str,
    "json_or_str": _json_or_str,
    "human_readable_int@sglang": _human_int_sglang,
    "human_readable_int@vllm": _human_int_vllm,
    "human_readable_int_or_auto@vllm": _human_int_or_auto_vllm,
}


def _type(name: str | None) -> Callable[[str], Any] | None:
    if name is None or name.startswith("other:"):
        return None
    if name.startswith("optional:"):
        inner = _type(name.removeprefix("optional:"))
        return _optional(inner or str)
    if name not in TYPES:
        raise ValueError(f"engine flags fixture names type {name!r}, which argcheck does not know; add it to TYPES")
    return TYPES[name]


class _Deprecated(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error(f"{option_string} is deprecated; use its replacement (see the engine's --help)")


def build_parser(record: dict[str, Any], *, allow_deprecated: bool = False) -> argparse.ArgumentParser:
    """An argparse parser with the recorded actions, that raises instead of exiting."""
    parser = _RecordedParser(prog=record.get("prog"), allow_abbrev=False, exit_on_error=False, add_help=False)
    groups = {}
    for dests in record.get("mutually_exclusive", []):
        group = parser.add_mutually_exclusive_group()
        groups.update({dest: group for dest in dests})
    for action in record["actions"]:
        kind = action["kind"]
        if kind in ("help", "version"):
            continue
        target: Any = groups.get(action["dest"], parser)
        opts = action["option_strings"]
        if opts:
            names, kwargs = list(opts), {"dest": action["dest"], "required": action["required"]}
        else:
            names, kwargs = [action["dest"]], {}
        # engine_flags.py writes a default JSON cannot hold as {"repr": ...}; it stays that dict in the result.
        kwargs["default"] = action["default"]
        nargs = action["nargs"]
        if action.get("deprecated") and not allow_deprecated:
            kwargs.update(action=_Deprecated, nargs=nargs)
        elif kind == "store_true" or kind == "store_false":
            kwargs["action"] = kind
        elif kind == "boolean_optional":
            negatives = {"--no-" + o[2:] for o in opts if o.startswith("--")}
            names = [o for o in opts if o not in negatives]
            kwargs["action"] = argparse.BooleanOptionalAction
        elif kind in ("count",):
            kwargs["action"] = kind
        elif kind in ("store_const", "append_const") or (kind == "custom" and nargs == 0):
            kwargs.update(action="append_const" if kind == "append_const" else "store_const", const=action["const"])
        elif kind in ("store", "append", "custom"):
            kwargs.update(action="append" if kind == "append" else "store", nargs=nargs, type=_type(action["type"]))
            if nargs == "?":  # the flag given without a value stores const (SGLang's --model-checksum: "")
                kwargs["const"] = action["const"]
            if action["choices"] is not None:
                kwargs["choices"] = action["choices"]
        else:
            raise ValueError(f"engine flags fixture has action kind {kind!r} for {opts}; argcheck cannot rebuild it")
        target.add_argument(*names, **kwargs)
    return parser


def parse_with_fixture(
    path_or_name: str | Path, argv: Sequence[str], *, allow_deprecated: bool = False
) -> dict[str, Any]:
    """Parse argv (without the program or ``-m module`` prefix) as the recorded engine would; its dests as a dict."""
    record = load_fixture(path_or_name)
    label = f"{record['engine']} {record['version']}"
    parser = build_parser(record, allow_deprecated=allow_deprecated)
    try:
        namespace = parser.parse_args(list(argv))
    except (_Problem, argparse.ArgumentError) as exc:
        raise ArgvRefused(label, str(exc), argv) from None
    return vars(namespace)
