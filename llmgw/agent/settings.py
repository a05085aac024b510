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
hostname and the route; the state directory follows the user. Reading and merging the three sources,
and saying where a bad value came from, is ``settingsload``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic_core import PydanticCustomError

from llmgw.agent import engines
from llmgw.agent.supervisor import identity, liveness
from llmgw.core import skew, units
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
    #: TLS on the engines (``enginetls``): auto (when they listen beyond loopback), on (always), off (never).
    engine_tls: Literal["auto", "on", "off"] = "auto"
    #: How routers reach the engines (issue 33): direct (at mgmt_addr), tunnel (through a connection the agent
    #: dials out to the control plane; the engines listen on loopback only), auto (tunnel when a router cannot
    #: reach mgmt_addr). tunnel and auto need the node certificate (a joined agent, not --insecure).
    engine_access: Literal["direct", "tunnel", "auto"] = "direct"
    discovery: DiscoverySettings = pydantic.Field(default_factory=DiscoverySettings)
    #: The wire protocol this agent says it speaks (``core.skew``): this release's. Set only to test the skew
    #: policy (an agent acting as a newer or older release); a control plane refuses one outside its policy.
    protocol: int = pydantic.Field(default=skew.PROTOCOL, ge=0)

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

    @pydantic.field_validator("engine_tls", mode="before")
    @classmethod
    def _engine_tls(cls, v: object) -> object:
        # YAML reads a bare on/off as true/false: `engine_tls: off` means off.
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

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
