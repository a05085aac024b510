"""The agent's settings, and the defaults it finds rather than being told.

A file that has to say which machine it is on and at what address differs on
every node, and a copy taken from one node to the next registers the second as
the first; so the node id comes from the hostname and the management address
from the route to the control plane.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import socket
from pathlib import Path

from llmgw.agent import enginetls, nodepki
from llmgw.agent.settings import DEFAULT_AGENT_PORT, AgentSettings, DiscoverySettings
from llmgw.agent.supervisor import identity as engine_identity
from llmgw.agent.supervisor import liveness
from llmgw.core import skew
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)


#: The settings' defaults (``AgentSettings``), which a configuration made in code takes too.
_D = {name: field.default for name, field in AgentSettings.model_fields.items()}
_DISCOVERY = DiscoverySettings()


@dataclasses.dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's settings as it runs on: every default found (node id, address, certificates, engine users)."""

    servers: tuple[str, ...]
    node_id: str
    mgmt_addr: str
    state_dir: Path
    model_dirs: tuple[Path, ...] = ()
    #: Where remote weights are fetched to (one of ``model_dirs``); None: ``<state_dir>/weights``.
    weights_cache: Path | None = None
    #: Directories a file source may lie under besides the model dirs (settings.source_roots).
    source_roots: tuple[Path, ...] = ()
    #: settings.fetch_allow_private: False, True, or the hosts (host[:port]) URL sources may reach.
    fetch_allow_private: bool | tuple[str, ...] = False
    heartbeat_interval_s: float = _D["heartbeat_interval"]
    reconnect_base_s: float = _D["reconnect_base"]
    reconnect_max_s: float = _D["reconnect_max"]
    stop_grace_s: float = _D["stop_grace"]
    adopt_ready_timeout_s: float = _D["adopt_ready_timeout"]
    #: How a Ready engine's health is probed (``probe_period_s`` and the rest of the settings).
    probes: liveness.Liveness = liveness.Liveness()
    labels: tuple[tuple[str, str], ...] = ()
    #: (fabric name, adapters) as declared; checked against the adapters as they are.
    fabrics: tuple[tuple[str, tuple[str, ...]], ...] = ()
    mgmt_interface: str = ""
    #: Engines outlive the agent unless this is set (``llmgw up`` sets it: it owns the whole system).
    stop_engines_on_exit: bool = _D["stop_engines_on_exit"]
    #: (engine, python) for each Python engine installed in an interpreter of its own.
    engine_python: tuple[tuple[str, str], ...] = ()
    #: Where engines are installed (``llmgw.agent.provision``); None: ``<state_dir>/engines``.
    engines_dir: Path | None = None
    engine_recheck_s: float = _D["engine_recheck_s"]
    #: Whether the agent's own python's engines are reported (settings.own_python_engines).
    own_python_engines: bool = _D["own_python_engines"]
    prefer_nvml: bool = _DISCOVERY.prefer_nvml
    nvidia_smi: str = _DISCOVERY.nvidia_smi
    sysfs_root: Path = _DISCOVERY.sysfs_root
    sminfo: str = _DISCOVERY.sminfo
    saquery: str = _DISCOVERY.saquery
    #: This node's certificates for mutual TLS (``nodepki``); None: plaintext, ``--insecure``.
    tls: nodepki.NodePki | None = None
    #: settings.engine_tls: auto, on or off (``enginetls``).
    engine_tls: str = "auto"
    #: settings.engine_access: direct, tunnel or auto (``agent.tunnel``; issue 33).
    engine_access: str = "direct"
    #: Who engines run as (settings.engine_user and engine_uids, resolved on this node): never root.
    engine_users: engine_identity.Policy = dataclasses.field(
        default_factory=lambda: engine_identity.resolve(engine_identity.AUTO))
    #: The wire protocol sent in Register (settings.protocol; ``core.skew``): this release's but in tests.
    protocol: int = skew.PROTOCOL


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/llmgw/agent")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "llmgw" / "agent"


def addr_toward(server: str) -> str:
    """This machine's source address on the route to ``server``.

    A UDP "connect" makes the kernel choose the route without sending a packet;
    asking the interfaces instead would have to guess among docker bridges,
    VPNs and link-local addresses.
    """
    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or DEFAULT_AGENT_PORT)))
            return str(s.getsockname()[0])
    except OSError as e:
        log.warning("cannot find the route to %s (%s); engines will listen on 127.0.0.1", server, e)
        return "127.0.0.1"


def _is_loopback(addr: str) -> bool:
    host = addr.rpartition(":")[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def identity(st: AgentSettings) -> tuple[nodepki.NodePki | None, str]:
    """(certificates, node id): the joined node's, or none with ``insecure``; LlmgwError when neither holds.

    With certificates the node id is their common name: the control plane refuses a Register naming another,
    so a --node-id that differs is refused here, where it is still obvious which setting to fix.
    """
    state_dir = st.state_dir or default_state_dir()
    joined = nodepki.of(state_dir)
    if st.insecure:
        far = [a for a in st.servers if not _is_loopback(a)]
        if far:
            raise LlmgwError(f"--insecure is for loopback development only, and {', '.join(far)} is not loopback: "
                             "join this node with `llmgw agent join` (print the command with `llmgw token create` "
                             "on the control plane) and run it without --insecure")
        log.warning("INSECURE: plaintext to the control plane, no certificate; anyone on this machine can "
                    "impersonate this node or the control plane. For loopback development only%s",
                    f" (the certificates in {joined.dir} are not used)" if joined else "")
        return None, st.node_id or socket.gethostname()
    if joined is None:
        raise LlmgwError(f"this node has not joined a cluster (no {state_dir / nodepki.PKI}): run `llmgw agent join "
                         "--server HOST:JOINPORT --token T --ca-hash sha256:...` (`llmgw token create` on the "
                         "control plane prints it), or give --insecure for loopback development")
    cn = joined.node_id()
    if st.node_id and st.node_id != cn:
        raise LlmgwError(f"this node joined as {cn!r} (the common name of {joined.cert}), and the settings name node "
                         f"{st.node_id!r}: the control plane would refuse it; drop the node id setting (or set it "
                         f"to {cn}), or to be {st.node_id!r}, move {joined.dir} aside and join again")
    return joined, cn


def from_settings(st: AgentSettings) -> AgentConfig:
    """The agent's configuration: the settings as given, and every default found."""
    # Already HOST:PORT, validated and without duplicates (settings does it, once, for every source).
    addrs = tuple(st.servers)
    if not addrs:
        raise LlmgwError("no control plane address: set server in agent.yaml, LLMGW_AGENT_SERVER or --server")
    tls, found_id = identity(st)
    found_addr = st.mgmt_addr or addr_toward(addrs[0])
    model_dirs = list(st.model_dirs)
    if st.weights_cache is not None and st.weights_cache not in model_dirs:
        model_dirs.append(st.weights_cache)
    cfg = AgentConfig(
        servers=addrs, node_id=found_id, mgmt_addr=found_addr, state_dir=st.state_dir or default_state_dir(),
        model_dirs=tuple(model_dirs), weights_cache=st.weights_cache, heartbeat_interval_s=st.heartbeat_interval,
        source_roots=tuple(st.source_roots),
        fetch_allow_private=(st.fetch_allow_private if isinstance(st.fetch_allow_private, bool)
                             else tuple(st.fetch_allow_private)),
        reconnect_base_s=st.reconnect_base,
        reconnect_max_s=st.reconnect_max, stop_grace_s=st.stop_grace, adopt_ready_timeout_s=st.adopt_ready_timeout,
        probes=liveness.Liveness(period_s=st.probe_period_s, timeout_s=st.probe_timeout_s,
                                 failure_threshold=st.probe_failure_threshold),
        labels=tuple(sorted(st.labels.items())), fabrics=tuple((f.fabric, tuple(f.hcas)) for f in st.fabrics),
        mgmt_interface=st.mgmt_interface or "", stop_engines_on_exit=st.stop_engines_on_exit,
        engine_python=tuple(sorted((name, str(python)) for name, python in st.engine_python.items())),
        engines_dir=st.engines_dir, engine_recheck_s=st.engine_recheck_s, own_python_engines=st.own_python_engines,
        prefer_nvml=st.discovery.prefer_nvml, nvidia_smi=st.discovery.nvidia_smi,
        sysfs_root=st.discovery.sysfs_root, sminfo=st.discovery.sminfo, saquery=st.discovery.saquery, tls=tls,
        engine_users=engine_identity.resolve(st.engine_user, st.engine_uids), engine_tls=st.engine_tls,
        engine_access=st.engine_access, protocol=st.protocol)
    if tls is None and st.engine_access != "direct":
        raise LlmgwError(f"engine_access is {st.engine_access}, and this agent has no node certificate (--insecure, "
                         "or not joined) to dial the tunnel with; join the node (`llmgw agent join`) or set "
                         "engine_access to direct")
    if tls is None and enginetls.wanted(st.engine_tls, found_addr):
        if st.engine_tls == "on":
            raise LlmgwError("engine_tls is on, and this agent has no certificates (--insecure, or not joined) to "
                             "get an engine certificate with; join the node (`llmgw agent join`) or set engine_tls "
                             "to off")
        log.warning("agent: engines listen on %s in plain HTTP: engine_tls is auto, and an --insecure agent gets "
                    "no engine certificate", found_addr)
    for name, python in cfg.engine_python:
        if os.path.isfile(python) and os.access(python, os.X_OK):
            log.info("agent: engine %s runs with %s", name, python)
        else:
            # Not fatal: the engine may be installed there later, and the next probe finds it.
            log.warning("agent: engine %s is set to run with %s, which is not an executable file; %s is reported "
                        "not installed until it is (engine_python in agent.yaml, LLMGW_AGENT_%s_PYTHON)", name,
                        python, name, name.upper())
    log.info("agent: node id %s%s, management address %s%s, control plane %s, state in %s",
             cfg.node_id, " (its certificate)" if tls else "" if st.node_id else " (hostname)", cfg.mgmt_addr,
             "" if st.mgmt_addr else " (route)",
             ", ".join(cfg.servers), cfg.state_dir)
    return cfg
