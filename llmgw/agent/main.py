"""``llmgw agent``: discovery, the supervisor and the stream, wired together.

Engines outlive the agent: the router reaches them directly, so an agent
restart (an upgrade, a crash, systemd's restart) must not interrupt served
traffic. The next agent finds them in the state directory and adopts them
before it registers. Only ``--stop-engines-on-exit`` (which ``llmgw up`` sets,
since it owns the whole system) makes a stopping agent take its engines along.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from llmgw.agent import discovery, engines
from llmgw.agent import logs as logs_mod
from llmgw.agent.config import AgentConfig
from llmgw.agent.discovery import deltas, fabrics, files, nvlink, sm
from llmgw.agent.logring import LogRing, install
from llmgw.agent.session import Commands, Session
from llmgw.agent.supervisor import Supervisor
from llmgw.core.inventory import Heartbeat, Inventory
from llmgw.core.shards import ShardSpec, ShardStatus

log = logging.getLogger(__name__)


def agent_version() -> str:
    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


def install_log_ring() -> LogRing:
    """Everything the agent logs also goes to a ring that `llmgw logs NODE` reads, so nobody needs ssh."""
    return install(LogRing())


class _Discovery:
    """The probes, shared by registration and heartbeats so that neither asks a tool twice in a minute."""

    def __init__(self, cfg: AgentConfig, model_dirs: list[Path]) -> None:
        self.cfg, self.model_dirs = cfg, model_dirs
        self.checker = fabrics.FabricChecker()
        self.sm_probe = sm.SubnetManagerProbe(sminfo=cfg.sminfo, saquery=cfg.saquery)
        self.nvlink_probe = nvlink.NvlinkProbe(nvidia_smi=cfg.nvidia_smi)
        self.sampler = discovery.LoadSampler(model_dirs=model_dirs, nvml=cfg.prefer_nvml, nvidia_smi=cfg.nvidia_smi,
                                             sysfs_root=cfg.sysfs_root)
        self.builder = deltas.HeartbeatBuilder()
        self.weights = deltas.Rescanner(lambda: files.scan_weights(model_dirs), interval_s=deltas.WEIGHTS_RESCAN_S)
        self.engines = deltas.Rescanner(lambda: tuple(engines.available()),
                                        interval_s=deltas.ENGINES_REPROBE_S)
        self.has_gpus = False
        #: The GPU indices of the last inventory; None before the first.
        self.gpu_indices: tuple[int, ...] | None = None

    def inventory(self) -> Inventory:
        inv = discovery.discover(
            model_dirs=self.model_dirs, nvml=self.cfg.prefer_nvml, nvidia_smi=self.cfg.nvidia_smi,
            sysfs_root=self.cfg.sysfs_root, declared_fabrics=list(self.cfg.fabrics), mgmt_addr=self.cfg.mgmt_addr,
            fabric_checker=self.checker, sm_probe=self.sm_probe, nvlink_probe=self.nvlink_probe)
        if self.cfg.mgmt_interface:
            import dataclasses

            inv = dataclasses.replace(inv, mgmt_interface=self.cfg.mgmt_interface)
        self.has_gpus = bool(inv.gpus)
        self.gpu_indices = tuple(g.index for g in inv.gpus)
        return inv

    def heartbeat(self, shard_pids: dict[str, int]) -> Heartbeat:
        load = self.sampler.sample(shard_pids=shard_pids)
        return self.builder.build(
            load, weights=self.weights.get(), engines=self.engines.get(),
            fabrics=self.checker.check(list(self.cfg.fabrics), load.hcas, loud=False),
            model_dirs=files.model_dirs(self.model_dirs),
            nvlink=self.nvlink_probe.sample() if self.has_gpus else None,
            subnet_managers=self.sm_probe.sample(load.hcas), shard_load=load.shard_load)

    def close(self) -> None:
        self.sampler.close()


async def run(cfg: AgentConfig, *, ring: LogRing | None = None, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    ring = ring or install_log_ring()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    model_dirs = list(cfg.model_dirs) or [cfg.state_dir / "weights"]
    found = _Discovery(cfg, model_dirs)
    session: Session | None = None

    def on_status(status: ShardStatus) -> None:
        if session is not None:
            session.report(status)

    run_dir = cfg.state_dir / "shards"
    supervisor = Supervisor(run_dir=run_dir, host=cfg.mgmt_addr, on_status=on_status, grace_s=cfg.stop_grace_s,
                            adopt_timeout_s=cfg.adopt_ready_timeout_s, live=cfg.probes,
                            node_gpus=lambda: found.gpu_indices)
    # Before registering, so that the Register lists the engines a previous
    # agent left and the control plane does not start them a second time.
    adopted = await supervisor.recover()
    if adopted:
        log.info("adopted %d engines a previous agent left running: %s", len(adopted),
                 ", ".join(s.shard_id for s in adopted))

    async def start(spec: ShardSpec) -> object:
        return await supervisor.start(spec)

    async def stop_shard(shard_id: str, reason: str) -> object:
        return await supervisor.stop(shard_id, reason=reason)

    async def drain(shard_id: str, timeout_s: float) -> object:
        return await supervisor.drain(shard_id, timeout_s=timeout_s)

    shard_logs = logs_mod.ShardLogs(run_dir, node_id=cfg.node_id,
                                    known=lambda: [s.shard_id for s in supervisor.statuses()])

    def read_logs(shard_id: str, lines: int, follow: bool) -> AsyncIterator[list[str]]:
        return logs_mod.read(shard_id=shard_id, lines=lines, follow=follow, ring=ring, shard_log=shard_logs.find)

    session = Session(cfg, inventory=found.inventory, heartbeat=lambda: found.heartbeat(supervisor.pids()),
                      on_register=found.builder.baseline,
                      commands=Commands(start=start, stop=stop_shard, drain=drain, statuses=supervisor.statuses,
                                        logs=read_logs),
                      agent_version=agent_version())
    stream = asyncio.create_task(session.run_forever())
    try:
        await stop.wait()
    finally:
        if cfg.stop_engines_on_exit:
            log.info("agent stopping: stopping %d engines", len(supervisor.statuses()))
            await supervisor.stop_all(reason="agent stopping")
            # Their Stopped statuses go out before the stream closes, so the
            # control plane replaces them now instead of after the node's
            # grace period; bounded, because a stop must not hang on a dead network.
            await session.flush(timeout=1.0)
        else:
            log.info("agent stopping; its %d engines keep serving and the next agent adopts them",
                     len(supervisor.pids()))
        stream.cancel()
        await supervisor.close()
        found.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
