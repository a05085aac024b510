"""The agent's settings: a YAML file, then ``LLMGW_AGENT_*`` environment variables, then flags.

One schema (:class:`AgentSettings`) validates all three, and every problem is
reported at once, each naming where the bad value came from — the file and
field, the environment variable, or the flag — because an agent that refuses
to start on a node nobody is logged into has to say exactly what to change.

Precedence is flags > environment > file > defaults, field by field, with two
exceptions. ``discovery`` and ``engine_python`` merge key by key. And the control plane addresses
(``server`` and ``servers``) are one setting: the highest source that names any
replaces every lower one's, or ``--server`` pointed at a test control plane
would still fail over to the production ones the file lists.

Defaults are found rather than written where they can be: the node id and
management address are left None here for the caller to find from the
hostname and the route; the state directory follows the user.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, get_args

import pydantic
import yaml
from pydantic_core import PydanticCustomError

from llmgw.agent import engines, nodepki
from llmgw.agent.supervisor import identity, liveness
from llmgw.core import units
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)

ENV_PREFIX = "LLMGW_AGENT_"
# Variables with the prefix that are not settings; no warning for them.
ENV_NOT_SETTINGS = frozenset({"LLMGW_AGENT_CONFIG"})
DEFAULT_AGENT_PORT = 8081
_LIST_FIELDS = ("servers", "model_dirs", "source_roots")
#: Settings that are mappings and merge key by key across the file, the environment and the flags.
_MERGED_FIELDS = ("discovery", "engine_python")
#: ``LLMGW_AGENT_VLLM_PYTHON``: one engine's interpreter, as ``engine_python[vllm]``.
_ENGINE_PYTHON_SUFFIX = "_PYTHON"


class SettingsError(LlmgwError):
    """The settings are invalid; ``problems`` has one sentence per problem, each naming its source."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


def _duration(value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())  # "5" from the environment is seconds, as 5 in YAML is
        except ValueError:
            pass
    try:
        seconds = units.parse_duration(value)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or (isinstance(value, int | float) and value < 0):
        raise PydanticCustomError("duration", "expected a duration such as 5s, got {value}", {"value": repr(value)})
    return seconds


Duration = Annotated[float, pydantic.BeforeValidator(_duration)]


def _absolute(value: Path) -> Path:
    path = value.expanduser()
    if not path.is_absolute():
        # Under systemd the agent runs from /, so a relative path named one
        # directory when tried by hand and another as a service.
        raise PydanticCustomError("relative_path", "must be an absolute path, got {value}", {"value": str(value)})
    return path


AbsPath = Annotated[Path, pydantic.AfterValidator(_absolute)]


def _address(raw: str) -> str:
    """HOST or HOST:PORT -> HOST:PORT, the agent port filled in; a bare IPv6 address is bracketed."""
    addr = raw.strip()
    if "://" in addr:
        raise PydanticCustomError("address", "give HOST:PORT (the agent port, {port} by default), not a URL such "
                                  "as {value}", {"value": repr(raw), "port": DEFAULT_AGENT_PORT})
    if addr.count(":") > 1 and not addr.startswith("["):
        addr = f"[{addr}]"  # its last group is not a port
    port: str | None
    if addr.startswith("["):
        host, _, rest = addr.partition("]")
        host += "]"
        port = rest[1:] if rest.startswith(":") else (None if rest else "")
    else:
        host, _, port = addr.partition(":")
    if (host in ("", "[]") or port is None or any(c.isspace() for c in addr)
            or (port and not (port.isdigit() and 0 < int(port) < 65536))):
        raise PydanticCustomError("address", "{value} is not HOST:PORT (the agent port, {port} by default)",
                                  {"value": repr(raw), "port": DEFAULT_AGENT_PORT})
    return f"{host}:{port or DEFAULT_AGENT_PORT}"


Address = Annotated[str, pydantic.AfterValidator(_address)]


def _uid_range(value: object) -> object:
    if isinstance(value, str):
        try:
            return identity.parse_uids(value)
        except ValueError as e:
            raise PydanticCustomError("uids", str(e)) from None
    if isinstance(value, int | list | tuple):
        raise PydanticCustomError("uids", "expected a range of uids such as 600000-609999, got {value}",
                                  {"value": repr(value)})
    return value


UidRange = Annotated[tuple[int, int], pydantic.BeforeValidator(_uid_range)]


class _Strict(pydantic.BaseModel):
    # Unknown keys are refused: a misspelt setting that is silently ignored
    # is a node that runs on defaults while its file says otherwise.
    model_config = pydantic.ConfigDict(extra="forbid")


class DiscoverySettings(_Strict):
    """Where hardware discovery looks; paths and programs are settings so tests and odd installs can point them."""

    # NVML gives NVLink topology, which nvidia-smi's XML does not.
    prefer_nvml: bool = True
    nvidia_smi: str = "nvidia-smi"
    sysfs_root: Path = Path("/sys/class/infiniband")
    sminfo: str = "sminfo"
    saquery: str = "saquery"


class FabricAttachment(_Strict):
    """The adapters of this node on one named fabric.

    Explicit on purpose: OpenSM's default subnet prefix is the same on every
    fabric, so which fabric an adapter is on cannot be read from the wire.
    """

    fabric: str
    hcas: list[str]

    @pydantic.field_validator("fabric")
    @classmethod
    def _fabric(cls, v: str) -> str:
        if not v.strip():
            raise PydanticCustomError("fabric", "must name the fabric, such as ib-a")
        return v.strip()

    @pydantic.field_validator("hcas")
    @classmethod
    def _hcas(cls, v: list[str]) -> list[str]:
        names = [h.strip() for h in v]
        if not names:
            raise PydanticCustomError("hcas", "must list at least one adapter, such as mlx5_0")
        if not all(names):
            raise PydanticCustomError("hcas", "an adapter name is empty")
        return list(dict.fromkeys(names))


class AgentSettings(_Strict):
    """Everything the agent is told. Read ``servers`` for where to dial: ``server`` is its first entry."""

    node_id: str | None = None
    server: Address | None = None
    servers: list[Address] = []
    mgmt_addr: str | None = None
    mgmt_interface: str | None = None
    labels: dict[str, str] = {}
    fabrics: list[FabricAttachment] = []
    model_dirs: list[AbsPath] = []
    weights_cache: AbsPath | None = None
    #: Directories a ``file:`` source may lie under, besides model_dirs and weights_cache (always roots);
    #: anything else (/etc/shadow, the agent's key) is refused before it is opened (``sourcepaths``).
    source_roots: list[AbsPath] = []
    #: Whether URL sources may reach loopback, link-local and this node's own addresses (``fetch.guard``):
    #: false (none), true (any), or the host / host:port that may. The cluster's hub and mirror are trusted.
    fetch_allow_private: bool | list[str] = False
    state_dir: AbsPath | None = None
    heartbeat_interval: Duration = 5.0
    reconnect_base: Duration = 0.5
    reconnect_max: Duration = 30.0
    adopt_ready_timeout: Duration = 60.0
    stop_grace: Duration = 10.0
    # Liveness of a Ready engine (``supervisor.liveness`` says how the defaults were measured).
    # The "_s" is in the names so that the variables are LLMGW_AGENT_PROBE_PERIOD_S and
    # LLMGW_AGENT_PROBE_TIMEOUT_S, the names system tests and operators set; 500ms is read too.
    probe_period_s: Duration = liveness.PERIOD_S
    probe_timeout_s: Duration = liveness.TIMEOUT_S
    probe_failure_threshold: int = liveness.FAILURE_THRESHOLD
    stop_engines_on_exit: bool = False
    #: Loopback development only: plaintext to the control plane, no certificate (``llmgw server --insecure``).
    insecure: bool = False
    #: The Python that has each Python engine installed ({"vllm": "/opt/vllm/bin/python"}); an engine not
    #: named runs with the agent's own. vLLM and SGLang are usually in venvs of their own: their torch
    #: pins clash with each other's, and with anything else on the node.
    engine_python: dict[str, AbsPath] = {}
    #: Where llmgw installs the engines the control plane asks for (``llmgw.agent.provision``): one venv per
    #: engine, version and variant. None: ``<state_dir>/engines``.
    engines_dir: AbsPath | None = None
    #: How often each Ready install is probed again (a library removed by an unrelated upgrade is found then).
    engine_recheck_s: Duration = 600.0
    #: Whether the engines the agent's own python has (xllamacpp, a vLLM beside llmgw) are reported as
    #: runnable. On by default so that ``make up`` and a pip-installed llmgw keep working; off, a node reports
    #: only what llmgw installed and saw run, the engines engine_python names, and the built-in sim.
    own_python_engines: bool = True
    #: Who engines run as (``supervisor.identity``): auto (as root, a uid of its own per shard from engine_uids),
    #: a user's name (every shard as that user), or agent (the agent's own user; refused as root). Never root.
    engine_user: str = identity.AUTO
    #: The uids ``auto`` hands out, LOW-HIGH (the gid is the same number; no /etc/passwd entry is needed).
    engine_uids: UidRange = identity.DEFAULT_UIDS
    discovery: DiscoverySettings = pydantic.Field(default_factory=DiscoverySettings)

    @pydantic.field_validator("node_id")
    @classmethod
    def _node_id(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c.isspace() for c in v.strip())):
            raise PydanticCustomError("node_id", "must be one word (it is the node's name everywhere), got {value}",
                                      {"value": repr(v)})
        return v.strip() if v else v

    @pydantic.field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, v: object) -> object:
        if isinstance(v, Mapping):
            for key, value in v.items():
                if isinstance(value, bool | int | float):
                    # YAML reads `gpu: yes` as True and `rack: 05` as 5; quoting
                    # keeps the label what was written.
                    raise PydanticCustomError("label", "the value of {key} must be a string: YAML read it as "
                                              "{value}; write it in quotes", {"key": key, "value": repr(value)})
        return v

    @pydantic.field_validator("engine_python")
    @classmethod
    def _engine_python(cls, v: dict[str, Path]) -> dict[str, Path]:
        unknown = sorted(set(v) - set(engines.PYTHON_ENGINES))
        if unknown:
            raise PydanticCustomError("engine", "{names} is not an engine that runs in a Python of its own; name "
                                      "{known}", {"names": ", ".join(unknown),
                                                  "known": " or ".join(sorted(engines.PYTHON_ENGINES))})
        return v

    @pydantic.field_validator("engine_user")
    @classmethod
    def _engine_user(cls, v: str) -> str:
        if not v.strip() or any(c.isspace() for c in v.strip()):
            raise PydanticCustomError("engine_user", "expected auto, agent or a user's name, got {value}",
                                      {"value": repr(v)})
        return v.strip()

    @pydantic.field_validator("heartbeat_interval", "reconnect_base", "adopt_ready_timeout", "probe_period_s",
                              "probe_timeout_s", "engine_recheck_s")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise PydanticCustomError("positive", "must be more than 0s")
        return v

    @pydantic.field_validator("probe_failure_threshold", mode="before")
    @classmethod
    def _threshold(cls, v: object) -> object:
        # YAML reads `yes` as True, which pydantic would take for 1.
        if isinstance(v, bool):
            raise PydanticCustomError("threshold", "expected a whole number of failed probes such as 3, got {value}",
                                      {"value": repr(v)})
        return v

    @pydantic.field_validator("probe_failure_threshold")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise PydanticCustomError("threshold", "must be at least 1 (the failed probes in a row that make a "
                                      "shard Unhealthy), got {value}", {"value": v})
        return v

    @pydantic.field_validator("fabrics")
    @classmethod
    def _fabrics(cls, v: list[FabricAttachment]) -> list[FabricAttachment]:
        seen_fabric: set[str] = set()
        owner: dict[str, str] = {}
        for f in v:
            if f.fabric in seen_fabric:
                raise PydanticCustomError("fabrics", "fabric {fabric} is listed twice; list all its adapters "
                                          "under one entry", {"fabric": f.fabric})
            seen_fabric.add(f.fabric)
            for h in f.hcas:
                if h in owner:
                    raise PydanticCustomError("fabrics", "adapter {hca} is on both {a} and {b}; an adapter is "
                                              "cabled to one fabric", {"hca": h, "a": owner[h], "b": f.fabric})
                owner[h] = f.fabric
        return v

    @pydantic.model_validator(mode="after")
    def _resolve(self) -> AgentSettings:
        # Both are accepted: every configuration written before there could be
        # a second control plane names one address, and none should have to change.
        addrs = list(dict.fromkeys(([self.server] if self.server else []) + self.servers))
        self.servers, self.server = addrs, (addrs[0] if addrs else None)
        if self.state_dir is None:
            self.state_dir = default_state_dir(os.environ)
        if self.reconnect_max < self.reconnect_base:
            raise PydanticCustomError("reconnect", "reconnect_max ({max}s) must be at least reconnect_base ({base}s)",
                                      {"max": f"{self.reconnect_max:g}", "base": f"{self.reconnect_base:g}"})
        dirs = list(dict.fromkeys(self.model_dirs))
        if self.weights_cache is None:
            self.weights_cache = dirs[0] if dirs else self.state_dir / "weights"
        # The directory downloads land in is always one that is looked in:
        # when they were two settings, a node filled its disk with fetched
        # weights that placement never saw.
        if self.weights_cache not in dirs:
            dirs.append(self.weights_cache)
        self.model_dirs = dirs
        return self


def default_state_dir(env: Mapping[str, str], *, euid: int | None = None) -> Path:
    """/var/lib/llmgw/agent as root, else $XDG_STATE_HOME/llmgw/agent (~/.local/state by default)."""
    if (os.geteuid() if euid is None else euid) == 0:
        return Path("/var/lib/llmgw/agent")
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "llmgw" / "agent"


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
