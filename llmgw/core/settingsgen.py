"""Flags, environment variables and settings-file keys generated from one settings dataclass.

A process's settings are one frozen dataclass whose fields are made with :func:`setting`: the
default (written once, there), the help text, and where the flag's name or the environment variable
differ from what the field's name gives. :func:`settings_of` lists what a command line, an
environment or a settings file can set, a nested settings dataclass (:func:`nested`) flattened into
it; :func:`add_arguments` turns that into argparse flags, a CLI framework's adapter turns it into its
options (``llmgw.cli.settingsflags`` for typer), and :func:`build` makes the settings object from the
values found, so the dataclass's ``__post_init__`` validates them in one place.

Only the standard library: ``llmgw.core`` imports nothing else of llmgw.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: What a field's metadata holds; absent keys take what the field's name gives.
_HELP, _FLAG, _ENV, _METAVAR, _PARSE, _NESTED, _EXTRA = ("help", "flag", "env", "metavar", "parse", "nested",
                                                         "extra")


def setting(default: Any = dataclasses.MISSING, *, help: str, flag: str | None = None, env: str | None = None,
            metavar: str | None = None, parse: Callable[[str], Any] | None = None,
            default_factory: Callable[[], Any] | None = None, **extra: Any) -> Any:
    """A settings field: its one default, the help its flag shows, and its names where the field's do not give them.

    ``flag``: the flag's spelling (``--control``) [default: ``--`` and the field's name with hyphens];
    ``env``: the variable that sets it (``LLMGW_TRACING_ENDPOINT``) [default: none]; ``parse``: str to
    value for the flag and the variable, raising ValueError with a sentence [default: the field's type];
    ``extra``: what only one CLI framework reads (``min``/``max`` for typer, ``required``, ``group``).
    """
    meta = {_HELP: help, _FLAG: flag, _ENV: env, _METAVAR: metavar, _PARSE: parse, _EXTRA: extra}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def nested(cls: type) -> Any:
    """A field holding another settings dataclass, whose settings are flattened into this one's flags."""
    return dataclasses.field(default_factory=cls, metadata={_NESTED: cls})


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One thing a flag, a variable or a settings-file key sets."""

    #: Field names from the outer settings class down, e.g. ("router", "keepalive").
    path: tuple[str, ...]
    flag: str
    help: str
    default: Any
    #: The field's type, resolved (``float``, ``Path | None``, ``tuple[str, ...]``).
    type: Any
    env: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        """The keyword the value travels under (flat, unique): the field's own name."""
        return self.path[-1]

    @property
    def key(self) -> str:
        """The settings file's key: the path, dotted."""
        return ".".join(self.path)


def settings_of(cls: type) -> list[Setting]:
    """Every setting of a settings dataclass, nested ones flattened, in field order.

    A class with ``ENV_PREFIX`` (``ClassVar[str]``, e.g. ``"LLMGW_SERVER_"``) gives every setting without
    an ``env`` of its own the variable ``ENV_PREFIX`` + its name in capitals (``LLMGW_SERVER_NODE_GRACE``).
    """
    return list(_walk(cls, (), getattr(cls, "ENV_PREFIX", "")))


def _walk(cls: type, prefix: tuple[str, ...], env_prefix: str) -> Iterator[Setting]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if _NESTED in f.metadata:
            yield from _walk(f.metadata[_NESTED], (*prefix, f.name), env_prefix)
            continue
        if _HELP not in f.metadata:
            continue   # derived or internal: no flag
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        yield Setting(path=(*prefix, f.name), flag=f.metadata[_FLAG] or "--" + f.name.replace("_", "-"),
                      help=f.metadata[_HELP], default=default, type=hints[f.name],
                      env=f.metadata[_ENV] or (env_prefix + f.name.upper() if env_prefix else None),
                      metavar=f.metadata[_METAVAR], parse=f.metadata[_PARSE], extra=f.metadata[_EXTRA])


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """The settings object from values keyed by :attr:`Setting.name`; absent ones keep their default."""
    return _build(cls, values)


def _build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if _NESTED in f.metadata:
            kwargs[f.name] = _build(f.metadata[_NESTED], values)
        elif _HELP in f.metadata and f.name in values:
            kwargs[f.name] = values[f.name]
    return cls(**kwargs)


def from_mapping(cls: type, doc: Any, source: str) -> dict[str, Any]:
    """A settings file's values (its parsed YAML or JSON) keyed by :attr:`Setting.name`.

    Keys are the settings' names, as the flags without their dashes (``http_port: 8080``, ``keepalive: 5``);
    a nested one may also be written by its path, as a mapping (``router: {keepalive: 5}``) or dotted. Text is
    parsed as the flag's would be; an unknown key or a bad value is a ValueError naming ``source`` and the key,
    and nothing of the file is used.
    """
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{source}: expected a mapping of settings, got {type(doc).__name__}")
    flat = dict(_flatten(doc, ""))
    found = settings_of(cls)
    by_key = {s.name: s for s in found} | {s.key: s for s in found}
    unknown = sorted(set(flat) - set(by_key))
    if unknown:
        raise ValueError(f"{source}: unknown setting {unknown[0]!r} (known: {', '.join(s.name for s in found)})")
    return {by_key[k].name: _from_file(by_key[k], v, f"{source}: {k}") for k, v in flat.items()}


def _flatten(doc: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for k, v in doc.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def _from_file(s: Setting, value: Any, where: str) -> Any:
    """A file's value for ``s``: text parsed as the flag's, lists for repeated ones, numbers and booleans checked."""
    kind = scalar(s.type)
    try:
        if is_many(s):
            items = value if isinstance(value, list) else [value]
            parsed = [_one(kind, None, item) for item in items]
            return tuple(parsed) if typing.get_origin(s.type) is tuple else parsed
        return _one(kind, s.parse, value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _one(kind: Any, parse: Callable[[str], Any] | None, value: Any) -> Any:
    if value is None:
        return None
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if isinstance(value, bool) or (kind in (int, float) and not isinstance(value, int | float | str)):
        raise ValueError(f"expected a {kind.__name__}, got {value!r}")
    if parse is not None:
        return parse(str(value))
    if kind is int and isinstance(value, float):
        raise ValueError(f"expected an integer, got {value!r}")
    return kind(value)


def scalar(tp: Any) -> Any:
    """The type a flag's one value parses to: ``Path`` for ``Path | None``, ``str`` for ``tuple[str, ...]``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        return args[0] if args else str
    if args and origin is not None:
        return args[0]
    return tp


def is_flag(s: Setting) -> bool:
    """A bool that is off unless given: ``--insecure``, taking no value."""
    return scalar(s.type) is bool and s.default is False


def is_many(s: Setting) -> bool:
    """Repeatable: a tuple or list of values (``--fetch-allow-private A --fetch-allow-private B``)."""
    return typing.get_origin(s.type) in (tuple, list) and s.parse is None


def add_arguments(parser: argparse.ArgumentParser | Any, cls: type, *, skip: tuple[str, ...] = (),
                  env: Mapping[str, str] | None = None, file: Mapping[str, Any] | None = None) -> None:
    """argparse flags for every setting (but ``skip``), each with its help and default; a setting's variable in
    ``env``, else its value in ``file`` (:func:`from_mapping`), becomes the default: a flag beats a variable,
    which beats the file. A ``group`` extra puts the flag in that mutually exclusive group."""
    groups: dict[str, Any] = {}
    for s in settings_of(cls):
        if s.name in skip:
            continue
        target = parser
        if "group" in s.extra:
            group = s.extra["group"]
            if group not in groups:
                groups[group] = parser.add_mutually_exclusive_group(required=s.extra.get("required", False))
            target = groups[group]
        kwargs: dict[str, Any] = {"dest": s.name, "help": s.help + (f" [env {s.env}]" if s.env else "")}
        given = env.get(s.env) if env is not None and s.env else None
        default = given if given is not None else (file or {}).get(s.name, s.default)
        if is_flag(s):
            kwargs.update(action="store_true")   # (a variable for an on/off flag: not offered by argparse here)
        else:
            kwargs.update(type=_argparse_type(s.parse or scalar(s.type)), default=default)
            if s.metavar:
                kwargs["metavar"] = s.metavar
            if is_many(s):
                kwargs["action"] = "append"
        target.add_argument(s.flag, **kwargs)


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    if parse in (int, float, str) or isinstance(parse, type):
        return parse

    def checked(value: str) -> Any:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    checked.__name__ = getattr(parse, "__name__", "value")
    return checked


def from_namespace(cls: type[Any], ns: argparse.Namespace) -> Any:
    """The settings object from argparse's answer (a repeated flag's list as a tuple where the field is one)."""
    values = {}
    for s in settings_of(cls):
        if hasattr(ns, s.name):
            value = getattr(ns, s.name)
            if is_many(s) and isinstance(value, list) and typing.get_origin(s.type) is tuple:
                value = tuple(value)
            values[s.name] = value
    return build(cls, values)
