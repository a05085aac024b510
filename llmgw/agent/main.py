"""``llmgw agent``: discovery, the supervisor and the stream, wired together.

In this version the agent stops its engines when it is told to stop: it cannot
yet adopt engines a previous agent left running, so an engine that outlived it
would be an orphan holding memory that placement hands out again.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import signal

from llmgw.agent import discovery
from llmgw.agent.config import AgentConfig
from llmgw.agent.session import Commands, Session
from llmgw.agent.supervisor import Supervisor
from llmgw.core.shards import ShardSpec, ShardStatus

log = logging.getLogger(__name__)


def agent_version() -> str:
    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


async def run(cfg: AgentConfig, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    model_dirs = list(cfg.model_dirs) or [cfg.state_dir]
    sampler = discovery.LoadSampler(model_dirs=model_dirs)
    session: Session | None = None

    def on_status(status: ShardStatus) -> None:
        if session is not None:
            session.report(status)

    supervisor = Supervisor(run_dir=cfg.state_dir / "shards", host=cfg.mgmt_addr, on_status=on_status,
                            grace_s=cfg.stop_grace_s)

    async def start(spec: ShardSpec) -> object:
        return await supervisor.start(spec)

    async def stop_shard(shard_id: str, reason: str) -> object:
        return await supervisor.stop(shard_id, reason=reason)

    session = Session(cfg, inventory=lambda: discovery.discover(model_dirs=model_dirs), sampler=sampler,
                      commands=Commands(start=start, stop=stop_shard, statuses=supervisor.statuses),
                      agent_version=agent_version())
    stream = asyncio.create_task(session.run_forever())
    try:
        await stop.wait()
    finally:
        log.info("agent stopping: stopping %d engines", len(supervisor.statuses()))
        await supervisor.stop_all(reason="agent stopping")
        # Their Stopped statuses go out before the stream closes, so the
        # control plane replaces them now instead of after the node's grace
        # period; bounded, because a stop must not hang on a dead network.
        await session.flush(timeout=1.0)
        stream.cancel()
        await supervisor.close()
        sampler.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
