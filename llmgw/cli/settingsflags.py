"""A typer command whose options are a settings dataclass's fields (``llmgw.core.settingsgen``).

:func:`options` writes the command's signature from the fields: one option per setting, with its
flag, default, help, environment variable and bounds; the function the command runs is given the
settings object, made and validated once (a ValueError from the dataclass is the ``error:`` line
and exit 1 that the hand-written commands printed).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer

from llmgw.core import settingsgen
from llmgw.core.settingsgen import Setting


def options(cls: type, *, defaults: Mapping[str, Any] | None = None, fail: Callable[[str], typer.Exit],
            group: bool = False, skip: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates ``run(settings, **more)`` into a typer command taking ``cls``'s settings as options.

    ``run``'s parameters after the first are the command's own options, written as typer's (``llmgw agent
    join --token``); ``skip``: settings this command does not offer (they keep their defaults).

    ``defaults``: where this command's default differs from the field's (``llmgw router --log-level`` is
    warning). ``fail``: the command's way to say an error and exit. ``group``: the command is a group's
    callback, which does nothing when one of the group's commands is run (``llmgw mirror add``).
    """
    found = [s for s in settingsgen.settings_of(cls) if s.name not in skip]
    defaults = defaults or {}
    prefix = getattr(cls, "ENV_PREFIX", "")   # a process's settings: a settings file too (--config)

    def decorate(run: Callable[..., Any]) -> Callable[..., Any]:
        own = list(inspect.signature(run, eval_str=True).parameters.values())[1:]
        @functools.wraps(run)
        def command(**given: Any) -> Any:
            ctx = given.pop("ctx", None)
            if group and ctx is not None and ctx.invoked_subcommand is not None:
                return None
            values = {s.name: _value(s, given.pop(s.name)) for s in found}
            config = given.pop(_CONFIG, None) if prefix else None
            try:
                values.update(_from_file(cls, config, found, ctx))
                settings = settingsgen.build(cls, {k: v for k, v in values.items() if v is not _KEEP})
            except ValueError as e:
                raise fail(str(e)) from None
            return run(settings, **given)

        params = [inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=_option(s, defaults),
                                    annotation=_annotation(s)) for s in found]
        if prefix:
            params.append(inspect.Parameter(_CONFIG, inspect.Parameter.KEYWORD_ONLY, annotation=Path | None, default=(
                typer.Option(None, "--config", envvar=prefix + "CONFIG", metavar="FILE",
                             help="A settings file (YAML): each setting by its name, e.g. `keepalive: 5`; a flag "
                                  "or a variable given beats it"))))
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + params
        if group or prefix:
            params.insert(0, inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__   # typer reads the signature written here, not run's
        return command

    return decorate


#: A value that leaves the field at its default.
_KEEP = object()
#: The settings file's parameter.
_CONFIG = "settings_file"


def _from_file(cls: type, path: Path | None, found: list[Setting], ctx: typer.Context | None) -> dict[str, Any]:
    """The file's values for the settings neither a flag nor a variable gave; ValueError naming file and key."""
    if path is None:
        return {}
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read the settings file {path}: {e}") from None
    values = settingsgen.from_mapping(cls, doc, str(path))
    # Given on the line or by a variable: kept. (ParameterSource by name: typer vendors its click.)
    sources = {s.name: getattr(ctx.get_parameter_source(s.name), "name", "") if ctx is not None else ""
               for s in found}
    given = {name for name, source in sources.items() if source in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")}
    return {k: v for k, v in values.items() if k not in given and k in {s.name for s in found}}


def _parsed(s: Setting) -> bool:
    """Given as text and parsed by the field's ``parse`` (``--control URL[,URL...]``)."""
    return s.parse is not None and s.parse not in (int, float, str)


def _annotation(s: Setting) -> Any:
    if _parsed(s):
        return str | None
    if settingsgen.is_many(s):
        return list[settingsgen.scalar(s.type)]
    return s.type


def _option(s: Setting, defaults: Mapping[str, Any]) -> Any:
    default = defaults.get(s.name, s.default)
    if _parsed(s):
        default = None
    elif settingsgen.is_many(s):
        default = list(default)
    kwargs = {k: v for k, v in s.extra.items() if k in ("min", "max")}
    if s.metavar and settingsgen.scalar(s.type) is not bool:
        kwargs["metavar"] = s.metavar
    return typer.Option(default, *s.flag.split(" "), help=_help(s), envvar=s.env, **kwargs)


def _help(s: Setting) -> str:
    text = s.help[:1].upper() + s.help[1:]
    return text.replace("[", "\\[")   # rich markup would eat "[default: ...]"


def _value(s: Setting, value: Any) -> Any:
    if value is None:
        return _KEEP if _parsed(s) else None
    if _parsed(s):
        try:
            return s.parse(value)  # type: ignore[misc]
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint=s.flag) from None
    if settingsgen.is_many(s):
        return tuple(value) if typing.get_origin(s.type) is tuple else list(value)
    return value
