"""``llmgw agent``: discovery, the supervisor and the stream, wired together.

Engines outlive the agent: the router reaches them directly, so an agent
restart (an upgrade, a crash, systemd's restart) must not interrupt served
traffic. The next agent finds them in the state directory and adopts them
before it registers. Only ``--stop-engines-on-exit`` (which ``llmgw up`` sets,
since it owns the whole system) makes a stopping agent take its engines along.

The installed engines' versions are probed by a task of their own, off the
event loop, at start and every ``ENGINES_REPROBE_S``: a vLLM probe imports
vLLM in its own Python (seconds; SGLang's import takes longer), and asked in
the heartbeat's turn it made that heartbeat late by as long. Heartbeats and
registrations read the last answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from llmgw.agent import (
    discovery,
    engines,
    enginetls,
    fabric,
    fetch,
    kvlink,
    privfile,
    provision,
    selfupgrade,
    sourcepaths,
    weights,
)
from llmgw.agent import logs as logs_mod
from llmgw.agent.config import AgentConfig
from llmgw.agent.discovery import deltas, fabrics, files, nvlink, sm
from llmgw.agent.fetch import guard as fetch_guard
from llmgw.agent.fetch import trust as fetch_trust
from llmgw.agent.logring import LogRing, install
from llmgw.agent.provision import ospkg
from llmgw.agent.session import Commands, Session
from llmgw.agent.supervisor import Supervisor, fetching
from llmgw.agent.supervisor.identity import Users
from llmgw.agent.tunnel.dialer import for_agent as tunnel_dialer
from llmgw.core import enginecheck
from llmgw.core.inventory import Gpu, Heartbeat, Inventory, WeightFile
from llmgw.core.provision import Provision
from llmgw.core.shards import ShardSpec, ShardStatus
from llmgw.core.version import version

log = logging.getLogger(__name__)


def install_log_ring() -> LogRing:
    """Everything the agent logs also goes to a ring that `llmgw logs NODE` reads, so nobody needs ssh."""
    return install(LogRing())


Versions = tuple[tuple[str, str], ...]


class EngineVersions:
    """The (name, version) of each installed engine, as last probed; one probe at a time."""

    def __init__(self, probe: Callable[[], list[tuple[str, str]]] = lambda: engines.available()) -> None:
        self._probe = probe
        self._lock = threading.Lock()
        self._found: Versions | None = None

    def latest(self) -> Versions | None:
        """The last probe's answer; None before the first has ended."""
        return self._found

    def probe(self) -> Versions:
        """Probe now (blocking: seconds for an engine whose import is slow)."""
        with self._lock:
            self._found = tuple(self._probe())
            return self._found

    def first(self) -> Versions:
        """The last answer, or, before there is one, the first probe's (blocking: waits for one under way)."""
        with self._lock:
            if self._found is None:
                self._found = tuple(self._probe())
            return self._found

    async def run(self, *, interval_s: float = deltas.ENGINES_REPROBE_S) -> None:
        """Probe in a thread at once and every ``interval_s``, until cancelled."""
        while True:
            try:
                await asyncio.to_thread(self.probe)
            except Exception:
                # An adapter's probe that raises must not end the probing: the
                # next one may find the engine installed.
                log.exception("probing the installed engines failed; trying again in %g s", interval_s)
            await asyncio.sleep(interval_s)


def facts_of(inv: Inventory | None, *, sampled_gpus: tuple[Gpu, ...] | None,
             versions: Versions | None) -> enginecheck.NodeFacts | None:
    """The last inventory's facts, with the GPUs as last sampled and the engines as last probed; None without one.

    The sampled GPUs replace the registered ones only when they are the same
    GPUs: their memory in use is now's, which is what a check of free memory
    needs, while a GPU that fell off the bus is the next registration's news,
    not a reason to check a launch against a partial list.
    """
    if inv is None:
        return None
    facts = enginecheck.NodeFacts.of(inv)
    if sampled_gpus is not None and sorted(g.index for g in sampled_gpus) == sorted(g.index for g in inv.gpus):
        facts = dataclasses.replace(facts, gpus=sampled_gpus)
    if versions is not None:
        facts = dataclasses.replace(facts, engines=versions)
    return facts


class _Discovery:
    """The probes, shared by registration and heartbeats so that neither asks a tool twice in a minute."""

    def __init__(self, cfg: AgentConfig, model_dirs: list[Path], *,
                 mark: Callable[[tuple[WeightFile, ...]], tuple[WeightFile, ...]] = lambda ws: ws) -> None:
        self.cfg, self.model_dirs = cfg, model_dirs
        # Marks what the weights cache's owner fetched (source, last use, cache name).
        self._mark = mark
        self.checker = fabrics.FabricChecker()
        self.sm_probe = sm.SubnetManagerProbe(sminfo=cfg.sminfo, saquery=cfg.saquery)
        self.nvlink_probe = nvlink.NvlinkProbe(nvidia_smi=cfg.nvidia_smi)
        self.sampler = discovery.LoadSampler(model_dirs=model_dirs, nvml=cfg.prefer_nvml, nvidia_smi=cfg.nvidia_smi,
                                             sysfs_root=cfg.sysfs_root)
        self.builder = deltas.HeartbeatBuilder()
        self.weights = deltas.Rescanner(lambda: mark(files.scan_weights(model_dirs)),
                                        interval_s=deltas.WEIGHTS_RESCAN_S)
        self.engines = EngineVersions()
        #: The engine installer (``provision``), set by ``run``: its installs go on Register and heartbeats.
        self.installer: provision.Installer | None = None
        self.has_gpus = False
        #: The last inventory (None before the first) and the GPUs the last heartbeat sampled.
        self._inventory: Inventory | None = None
        #: The last discovery, until a Register with it was accepted (``inventory``).
        self._discovered: Inventory | None = None
        self._gpus: tuple[Gpu, ...] | None = None

    def inventory(self) -> Inventory:
        """What a Register carries: discovered once per accepted stream, reused by the redials before one is.

        A node that no control plane takes (revoked, all of them down) redialled every 1-4 s and ran the
        whole discovery (nvidia-smi, sysfs, the subnet manager) each time, for a Register nobody read.
        What changed since is sent by the first heartbeat of the stream that is accepted, which also ends the reuse.
        """
        if self._discovered is None:
            self._discovered = discovery.discover(
                model_dirs=self.model_dirs, nvml=self.cfg.prefer_nvml, nvidia_smi=self.cfg.nvidia_smi,
                sysfs_root=self.cfg.sysfs_root, declared_fabrics=list(self.cfg.fabrics), mgmt_addr=self.cfg.mgmt_addr,
                fabric_checker=self.checker, sm_probe=self.sm_probe, nvlink_probe=self.nvlink_probe,
                engines=lambda: list(self.engines.first()))
        inv = self._discovered
        if self.cfg.mgmt_interface:
            inv = dataclasses.replace(inv, mgmt_interface=self.cfg.mgmt_interface)
        inv = dataclasses.replace(inv, weights=self._mark(inv.weights))
        if self.installer is not None:
            inv = dataclasses.replace(inv, installs=self.installer.installs())
        self.has_gpus = bool(inv.gpus)
        self._inventory, self._gpus = inv, None
        return inv

    def node_facts(self) -> enginecheck.NodeFacts | None:
        """This node's facts for the checks before a launch (``facts_of``); None before the first inventory."""
        return facts_of(self._inventory, sampled_gpus=self._gpus, versions=self.engines.latest())

    def heartbeat(self, shard_pids: dict[str, int]) -> Heartbeat:
        # Heartbeats go out only on a stream whose Register was accepted: the next one discovers afresh.
        self._discovered = None
        load = self.sampler.sample(shard_pids=shard_pids)
        self._gpus = load.gpus
        hb = self.builder.build(
            load, weights=self.weights.get(), engines=self.engines.latest(),
            fabrics=self.checker.check(list(self.cfg.fabrics), load.hcas, loud=False),
            model_dirs=files.model_dirs(self.model_dirs),
            nvlink=self.nvlink_probe.sample() if self.has_gpus else None,
            subnet_managers=self.sm_probe.sample(load.hcas), shard_load=load.shard_load)
        # The installs only when one changed (a state, a step, progress): None is "unchanged".
        installs = self.installer.take_changed() if self.installer is not None else None
        return dataclasses.replace(hb, installs=installs) if installs is not None else hb

    def registered(self, inv: Inventory) -> None:
        """A Register went out with ``inv``: heartbeats carry only what changes after it."""
        self.builder.baseline(inv)
        if self.installer is not None:
            self.installer.sent_all()

    def close(self) -> None:
        self.sampler.close()


def running_from(path: Path, pids: dict[str, int]) -> list[str]:
    """The shards whose process runs a program under ``path`` (an install's directory), by /proc."""
    found = []
    for shard_id, pid in pids.items():
        try:
            program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if program == str(path) or program.startswith(str(path).rstrip("/") + "/"):
            found.append(shard_id)
    return sorted(found)


def engine_users(cfg: AgentConfig) -> Users:
    """Who the engines run as, said once in the log; as root, what the agent writes is left readable by them.

    Weights it fetches and engines it installs must be readable by the engines'
    users, whatever umask the service manager gave the agent: only the write
    bits are kept from it (key, certificates, state files and logs are created 0600 regardless).
    """
    log.info("agent: %s", cfg.engine_users.describe())
    if cfg.engine_users.switches:
        old = os.umask(0o022)
        os.umask(old & 0o022)
    return Users(cfg.engine_users)


async def run(cfg: AgentConfig, *, ring: LogRing | None = None, stop: asyncio.Event | None = None) -> Path | None:
    """Runs the agent until ``stop`` (or a signal); returns the Python of an llmgw it upgraded itself to, which
    the caller re-executes into (``selfupgrade.exec_into``), or None for a plain stop."""
    stop = stop or asyncio.Event()
    ring = ring or install_log_ring()
    # Before anything probes or launches an engine: the registry runs each with its own Python.
    engines.configure(dict(cfg.engine_python), own_python=cfg.own_python_engines)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # 0711 when made here: engines of other users pass through it to their work dirs, weights and venvs,
    # and list nothing (the key and certificates are in pki/, 0700).
    privfile.make_dir(cfg.state_dir, 0o711)
    users = engine_users(cfg)
    model_dirs, cache_dir, roots = _weights_dirs(cfg)
    # The cluster CA (from the join) beside the system's authorities: the server's own mirror over TLS verifies.
    cluster_ca = cfg.tls.credentials()[0] if cfg.tls is not None else None
    fetcher = fetch.Fetcher(cache_dir, source_roots=roots, policy=fetch_guard.policy_of(cfg.fetch_allow_private),
                            tls=fetch_trust.context(cluster_ca))
    found = _Discovery(cfg, model_dirs, mark=lambda ws: fetching.mark_fetched(ws, cache_dir, fetcher.held()))
    session: Session | None = None

    kv = kvlink.KvLinks(lambda **body: session.outbox.send(**body) if session is not None else None)

    def on_status(status: ShardStatus) -> None:
        kv.seen(status)
        if session is not None:
            session.report(status)

    run_dir = cfg.state_dir / "shards"
    engine_tls = enginetls.EngineTls(mode=cfg.engine_tls, pki_dir=cfg.tls.dir if cfg.tls else None,
                                     node_id=cfg.node_id)
    # engine_access tunnel (issue 33): the engines listen on loopback only, reached through the agent's tunnel.
    supervisor = Supervisor(run_dir=run_dir, host="127.0.0.1" if cfg.engine_access == "tunnel" else cfg.mgmt_addr,
                            on_status=on_status, grace_s=cfg.stop_grace_s,
                            engine_tls=engine_tls,
                            adopt_timeout_s=cfg.adopt_ready_timeout_s, live=cfg.probes,
                            node=found.node_facts, fetcher=fetcher, on_weights_changed=found.weights.expire,
                            users=users, on_plan=kv.attach,
                            resolve=weights.resolver(roots), resolve_adapter=weights.adapter_resolver(roots))
    ca_bundle = fetch_trust.bundle(cfg.state_dir, cluster_ca)  # what pip verifies an https:// index with
    installer = provision.Installer(
        cfg.engines_dir or cfg.state_dir / "engines", profile=lambda: ospkg.profile(nvidia_smi=cfg.nvidia_smi),
        recheck_s=cfg.engine_recheck_s, in_use=lambda path: running_from(path, supervisor.pids()),
        on_change=lambda: loop.call_soon_threadsafe(installs_changed), ca_bundle=ca_bundle)
    found.installer = installer
    # An upgrade (``llmgw node upgrade``) installs another llmgw, then ends this run as a stop does, keeping the
    # engines, and says which Python to re-execute into.
    upgraded: list[Path] = []
    upgrader = selfupgrade.SelfUpgrade(cfg.state_dir, running_version=version(),
                                       restart=lambda python: (upgraded.append(python), stop.set()),
                                       ca_bundle=ca_bundle)
    reprobes: set[asyncio.Task[object]] = set()

    def installs_changed() -> None:
        # Launches use a Ready install's python from now on; the engines reported follow at the next heartbeat.
        engines.set_installed(tuple(engines.Installed(r.want.engine, r.want.version, str(r.python), r.variant.module)
                                    for r in installer.ready()))
        task = asyncio.create_task(asyncio.to_thread(found.engines.probe), name="probe engine versions")
        reprobes.add(task)
        task.add_done_callback(reprobes.discard)

    # Before registering, so that the Register lists the engines a previous
    # agent left and the control plane does not start them a second time.
    adopted = await supervisor.recover()
    if adopted:
        log.info("adopted %d engines a previous agent left running: %s", len(adopted),
                 ", ".join(s.shard_id for s in adopted))

    dialer = tunnel_dialer(cfg, supervisor.statuses, engine_tls)
    session = Session(cfg, inventory=found.inventory, heartbeat=lambda: found.heartbeat(supervisor.pids()),
                      on_register=lambda inv: (kv.resend(), found.registered(inv))[-1],
                      commands=_commands(cfg, supervisor, installer, ring, run_dir, session=lambda: session,
                                         upgrade=upgrader.begin, tunnel=dialer.offer if dialer else None),
                      agent_version=version(), engine_tls=engine_tls)
    versions = asyncio.create_task(found.engines.run(), name="probe engine versions")
    installing = asyncio.create_task(installer.run(), name="engine installer")
    stream = asyncio.create_task(session.run_forever())
    kv_sending = asyncio.create_task(kv.run(), name="send KV digests")
    stopping = asyncio.create_task(stop.wait(), name="wait for a stop signal")
    try:
        # The stream ends by itself only when the cluster refuses this node for good (rejoin.CertificateRefused).
        await asyncio.wait({stream, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        await _leave(cfg, session, supervisor, upgrading=bool(upgraded))
        stream.cancel()
        kv_sending.cancel()
        kv.close()
        versions.cancel()
        installing.cancel()
        if dialer is not None:
            await dialer.close()
        await supervisor.close()
        await fetcher.close()
        found.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    if stream.done() and not stream.cancelled() and (failed := stream.exception()) is not None:
        raise failed
    return upgraded[0] if upgraded else None


def _weights_dirs(cfg: AgentConfig) -> tuple[list[Path], Path, sourcepaths.Roots]:
    """The directories weights are looked for in, the one fetches land in, and where file sources may lie."""
    model_dirs = list(cfg.model_dirs) or [cfg.state_dir / "weights"]
    # Fetched weights are always looked for: placement must see what a node already holds.
    cache_dir = cfg.weights_cache or cfg.state_dir / "weights"
    if cache_dir not in model_dirs:
        model_dirs.append(cache_dir)
    # File sources only under the weights directories and source_roots; URL sources to no loopback,
    # link-local or own address unless fetch_allow_private says so (README, "The trust model").
    roots = sourcepaths.Roots.of(model_dirs, cfg.source_roots)
    log.info("agent: file sources under %s; URL sources %s", roots.describe(),
             fetch_guard.describe(cfg.fetch_allow_private))
    return model_dirs, cache_dir, roots


def _commands(cfg: AgentConfig, supervisor: Supervisor, installer: provision.Installer, ring: LogRing,
              run_dir: Path, *, session: Callable[[], Session | None],
              upgrade: Callable[..., None] | None = None,
              tunnel: Callable[[str, int], None] | None = None) -> Commands:
    """What the control plane's messages do on this node: the supervisor's, the installer's, the fabric test's."""

    async def start(spec: ShardSpec) -> object:
        # A start the session let through just before the agent began to leave runs here after the stop
        # sweep collected its shards: launched now, its engine would outlive the agent for good.
        current = session()
        if current is not None and current.leaving:
            current.refuse_start(spec)
            return None
        return await supervisor.start(spec)

    async def stop_shard(shard_id: str, reason: str) -> object:
        return await supervisor.stop(shard_id, reason=reason)

    async def drain(shard_id: str, timeout_s: float) -> object:
        return await supervisor.drain(shard_id, timeout_s=timeout_s)

    async def sleep(shard_id: str, level: int) -> object:
        return await supervisor.sleep(shard_id, level)

    shard_logs = logs_mod.ShardLogs(run_dir, node_id=cfg.node_id,
                                    known=lambda: [s.shard_id for s in supervisor.statuses()])

    def read_logs(shard_id: str, lines: int, follow: bool) -> AsyncIterator[list[str]]:
        return logs_mod.read(shard_id=shard_id, lines=lines, follow=follow, ring=ring, shard_log=shard_logs.find)

    fabric_runner = fabric.Runner(node_id=cfg.node_id, sysfs_root=cfg.sysfs_root)

    def provisioned(p: Provision) -> None:
        # One policy for OS packages: the cluster's (server --engine-os-packages), for engines and for perftest.
        fabric_runner.install = p.os_packages
        installer.apply(p)

    return Commands(start=start, stop=stop_shard, drain=drain, statuses=supervisor.statuses, logs=read_logs,
                    remove_weights=supervisor.remove_weights, provision=provisioned, fabric_test=fabric_runner.run,
                    upgrade=upgrade, sleep=sleep, tunnel=tunnel)


async def _leave(cfg: AgentConfig, session: Session, supervisor: Supervisor, *, upgrading: bool = False) -> None:
    """The agent's goodbye: no more starts, its engines stopped or left to the next agent, the last statuses sent.

    ``upgrading``: this process re-executes into another llmgw next, which adopts the engines: they are never
    stopped then, whatever ``stop_engines_on_exit`` says."""
    # First, before any shard is stopped: the control plane must not start the shards stopped below
    # again on this node, and this agent refuses any start that comes anyway.
    session.leave("agent upgrading" if upgrading else "agent stopping")
    if cfg.stop_engines_on_exit and not upgrading:
        log.info("agent stopping: stopping %d engines", len(supervisor.statuses()))
        await supervisor.stop_all(reason="agent stopping")
        # Their Stopped statuses go out before the stream closes, so the
        # control plane replaces them now instead of after the node's
        # grace period; bounded, because a stop must not hang on a dead network.
        await session.flush(timeout=1.0)
    else:
        log.info("agent stopping; its %d engines keep serving and the next agent adopts them",
                 len(supervisor.pids()))
        await session.flush(timeout=1.0)  # the goodbye
