"""Where the agent's settings come from: the YAML file, ``LLMGW_AGENT_*`` variables and flags, merged in that order.

``settings`` holds the schema (what a setting is and which values it takes); this module reads the three
sources, merges them by the rules the schema's docstring states, and turns every validation problem into
one sentence naming where the bad value came from (the file and field, the variable, or the flag).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import pydantic
import yaml

from llmgw.agent import engines, nodepki
from llmgw.agent.settings import (
    _ENGINE_PYTHON_SUFFIX,
    _LIST_FIELDS,
    _MERGED_FIELDS,
    ENV_NOT_SETTINGS,
    ENV_PREFIX,
    AgentSettings,
    DiscoverySettings,
    SettingsError,
    _address,
    default_state_dir,
)

#: The schema's logger: its warnings (an unknown variable) read as the settings' own.
log = logging.getLogger("llmgw.agent.settings")


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where values came from, for messages: ``label`` alone names the field for env and flags."""

    label: str
    names_field: bool  # True when the label already says which field (an env var or a flag)
    rank: int  # precedence: the file 1, the environment 2, flags 3


def load(*, path: Path | None, env: Mapping[str, str], flags: Mapping[str, object]) -> AgentSettings:
    """Reads ``path`` (None: no file), then ``env``, then ``flags``; raises SettingsError listing every problem.

    ``flags`` are keyed by field name ("heartbeat_interval", "discovery.prefer_nvml"); a value of None,
    or an empty list from a repeatable flag, is "not given".
    """
    problems: list[str] = []
    layers: list[tuple[dict[str, Any], dict[tuple[str, ...], _Source]]] = []
    file_label = str(path) if path is not None else "agent.yaml"
    if path is not None:
        layers.append(_from_file(path))
    env_layer, env_problems = _from_env(env)
    layers.append(env_layer)
    problems += env_problems
    layers.append(_from_flags(flags))

    merged: dict[str, Any] = {}
    origins: dict[tuple[str, ...], _Source] = {}
    for values, sources in layers:
        if "server" in values or "servers" in values:
            for key in ("server", "servers"):
                merged.pop(key, None)
                origins.pop((key,), None)
        for key, value in values.items():
            if key in _MERGED_FIELDS and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        origins.update(sources)
    if "state_dir" not in merged:
        merged["state_dir"] = default_state_dir(env)

    settings: AgentSettings | None = None
    try:
        settings = AgentSettings.model_validate(merged)
    except pydantic.ValidationError as e:
        problems += [_describe(err, origins) for err in e.errors()]
    if problems:
        raise SettingsError(problems)
    assert settings is not None
    if not settings.servers and settings.state_dir is not None:
        # A node that joined knows where its agent port is (`llmgw agent join` wrote it); any source naming
        # servers wins over that.
        joined = nodepki.of(settings.state_dir)
        if joined is not None and (found := [_address(s) for s in joined.servers()]):
            settings.servers, settings.server = found, found[0]
    if not settings.servers:
        raise SettingsError([f"no control plane address: set server in {file_label}, {ENV_PREFIX}SERVER or --server"])
    return settings


def _from_file(path: Path) -> tuple[dict[str, Any], dict[tuple[str, ...], _Source]]:
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError([f"{label}: no such file; give another with --config, or create it (see "
                             "examples/agent.yaml)"]) from None
    except UnicodeDecodeError as e:
        raise SettingsError([f"{label}: not UTF-8 text ({e.reason} at byte {e.start})"]) from None
    except OSError as e:
        raise SettingsError([f"{label}: cannot read it: {e.strerror or e}"]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{label} line {mark.line + 1}" if mark is not None else label
        problem = getattr(e, "problem", None) or str(e)
        raise SettingsError([f"{where}: not valid YAML: {problem}"]) from None
    if doc is None:
        return {}, {}
    if not isinstance(doc, dict):
        raise SettingsError([f"{label}: expected settings such as `server: HOST:PORT`, one a line; got a "
                             f"{type(doc).__name__}"])
    src = _Source(label, names_field=False, rank=1)
    origins: dict[tuple[str, ...], _Source] = {(str(k),): src for k in doc}
    for key in _MERGED_FIELDS:
        if isinstance(doc.get(key), dict):
            origins.update({(key, str(k)): src for k in doc[key]})
    return doc, origins


def _from_env(env: Mapping[str, str]) -> tuple[tuple[dict[str, Any], dict[tuple[str, ...], _Source]], list[str]]:
    values: dict[str, Any] = {}
    origins: dict[tuple[str, ...], _Source] = {}
    problems: list[str] = []
    fields = AgentSettings.model_fields
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        if not raw.strip():
            continue  # `LLMGW_AGENT_MGMT_ADDR=` in a systemd EnvironmentFile means "not set"
        src = _Source(name, names_field=True, rank=2)
        parts = name[len(ENV_PREFIX):].lower().split("__")
        if len(parts) == 2 and parts[0] == "discovery" and parts[1] in DiscoverySettings.model_fields:
            values.setdefault("discovery", {})[parts[1]] = raw
            origins[tuple(parts)] = src
            continue
        engine = _python_of(name)
        if engine is not None:
            values.setdefault("engine_python", {})[engine] = raw.strip()
            origins[("engine_python", engine)] = src
            continue
        if len(parts) != 1 or parts[0] not in fields or parts[0] in _MERGED_FIELDS:
            known = [ENV_PREFIX + f.upper() for f in fields if f not in _MERGED_FIELDS]
            known += [f"{ENV_PREFIX}DISCOVERY__{f.upper()}" for f in DiscoverySettings.model_fields]
            known += [f"{ENV_PREFIX}{e.upper()}{_ENGINE_PYTHON_SUFFIX}" for e in sorted(engines.PYTHON_ENGINES)]
            log.warning("%s is not an agent setting, and is ignored%s", name, _hint(name, known))
            continue
        key = parts[0]
        try:
            values[key] = _env_value(key, raw)
        except ValueError as e:
            problems.append(f"{name}: {e}")
            continue
        origins[(key,)] = src
    return (values, origins), problems


def _python_of(name: str) -> str | None:
    """The engine ``LLMGW_AGENT_<ENGINE>_PYTHON`` names; None for any other variable."""
    middle = name[len(ENV_PREFIX):]
    if not middle.endswith(_ENGINE_PYTHON_SUFFIX):
        return None
    engine = middle.removesuffix(_ENGINE_PYTHON_SUFFIX).lower()
    return engine if engine in engines.PYTHON_ENGINES else None


def _env_value(key: str, raw: str) -> object:
    if key in _LIST_FIELDS:
        return [item.strip() for item in raw.split(",") if item.strip()]
    if key == "labels":
        if raw.lstrip().startswith("{"):
            return _json(raw, 'expected k=v,k2=v2 or a JSON object such as {"rack": "r12"}')
        labels: dict[str, str] = {}
        for item in filter(None, (i.strip() for i in raw.split(","))):
            k, sep, v = item.partition("=")
            if not sep or not k.strip():
                raise ValueError(f"expected k=v,k2=v2, got {item!r}")
            labels[k.strip()] = v.strip()
        return labels
    if key == "fabrics":
        return _json(raw, 'expected JSON such as [{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]}]')
    if key == "fetch_allow_private" and raw.strip().lower() not in ("true", "false", "1", "0", "yes", "no"):
        return [item.strip() for item in raw.split(",") if item.strip()]   # HOST[:PORT],HOST[:PORT]
    return raw


def _json(raw: str, expected: str) -> object:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{expected}: {e}") from None


def _from_flags(flags: Mapping[str, object]) -> tuple[dict[str, Any], dict[tuple[str, ...], _Source]]:
    values: dict[str, Any] = {}
    origins: dict[tuple[str, ...], _Source] = {}
    for raw_key, value in flags.items():
        if value is None or (isinstance(value, list | tuple) and not value):
            continue  # not given
        key = raw_key.replace("__", ".")
        if key in ("server", "servers"):
            # A repeatable --server arrives as a list; it is the servers setting.
            if isinstance(value, list | tuple):
                key = "servers"
            src = _Source("--server", names_field=True, rank=3)
        else:
            src = _Source("--" + key.replace("_", "-").replace(".", "-"), names_field=True, rank=3)
        if key in ("labels", "engine_python") and isinstance(value, list | tuple):
            value = dict(str(v).partition("=")[::2] for v in value)  # repeatable --label k=v
        if key == "engine_python" and isinstance(value, Mapping):
            # Key by key, so that an error names the engine: --engine-python sglang=relative/python.
            values[key] = dict(value)
            origins.update({(key,): src, **{(key, str(k)): src for k in value}})
            continue
        if key.startswith("discovery."):
            sub = key.split(".", 1)[1]
            values.setdefault("discovery", {})[sub] = value
            origins[("discovery", sub)] = src
        else:
            values[key] = value
            origins[(key,)] = src
    return values, origins


def _describe(err: Any, origins: Mapping[tuple[str, ...], _Source]) -> str:
    """One pydantic error as "SOURCE: FIELD: what is wrong"."""
    loc: tuple[Any, ...] = tuple(err["loc"])
    message = _message(err, loc)
    if err["type"] == "reconnect":
        # Two fields disagree: blame the one given with the higher precedence.
        given = [origins[k] for k in (("reconnect_base",), ("reconnect_max",)) if k in origins]
        return f"{max(given, key=lambda s: s.rank).label}: {message}" if given else message
    for n in (2, 1):
        key = tuple(str(p) for p in loc[:n])
        if len(key) == n and key in origins:
            src = origins[key]
            rest = _where(loc[n:]) if src.names_field else _where(loc)
            return f"{src.label}: {rest}: {message}" if rest else f"{src.label}: {message}"
    return f"{_where(loc)}: {message}" if loc else message


def _message(err: Any, loc: tuple[Any, ...]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        names = list(_fields_at(loc[:-1]))
        return "not a setting" + _hint(str(loc[-1]), names)
    if kind == "missing":
        return "required"
    if kind == "bool_parsing" or kind == "bool_type":
        return f"expected true or false, got {err.get('input')!r}"
    msg: str = err["msg"]
    msg = msg.removeprefix("Value error, ")
    return msg[:1].lower() + msg[1:]


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The setting names valid at ``loc`` (the parent of an unknown key)."""
    model: type[pydantic.BaseModel] = AgentSettings
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        sub = _model_in(field.annotation) if field else None
        if sub is None:
            return []
        model = sub
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def _hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; the settings are: {', '.join(known)}" if known else ""
