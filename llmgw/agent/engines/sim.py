"""The sim engine adapter: ``python -m llmgw.sim.engine``, installed wherever llmgw is."""

from __future__ import annotations

import json
import sys

from llmgw.agent.engines import base
from llmgw.core import enginecheck, inventory, shards
from llmgw.core.version import version

MODULE = "llmgw.sim.engine"


def parse_sim_stats(body: bytes) -> int | None:
    """Requests generating plus requests waiting for a slot, from ``/sim/stats``; None if it says neither."""
    try:
        stats = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(stats, dict):
        return None
    running, waiting = stats.get("running"), stats.get("waiting")
    # bool is an int: a body of {"running": true} is not a count.
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (running, waiting)):
        return None
    return int(running) + int(waiting)


class Sim:
    """Adapter for llmgw's simulated engine: built in (the agent's python), or an install of its wheel."""

    name = "sim"
    health_path = "/health"

    def __init__(self, *, python: str | None = None, module: str = MODULE, version: str | None = None) -> None:
        # An install (llmgw.agent.provision) runs its own python and module, at the version it installed.
        self._python, self._module, self._version = python, module, version

    def validate(self, spec: shards.ShardSpec, *, node: enginecheck.NodeFacts | None = None,
                 model: inventory.WeightFile | None = None) -> None:
        base.check_common(self.name, spec, node=node, model=model)

    def launch(self, spec: shards.ShardSpec, *, host: str, port: int, model_path: str | None,
               cpu_count: int, node: enginecheck.NodeFacts = enginecheck.NodeFacts(), work_dir: str = "",
               python: str | None = None, tls: base.TlsFiles | None = None) -> base.Launch:
        # model_path, cpu_count, node and work_dir are unused: the sim loads nothing, spins no
        # threads, joins no collective and writes no cache.
        self.validate(spec)
        argv = [python or self._python or sys.executable, "-m", self._module, "--host", host, "--port", str(port),
                "--model", spec.served_name]
        if spec.nnodes > 1:
            # The sim has no collective to join; it takes its rank so that a
            # worker rank refuses the API (only the leader serves it) and
            # /sim/stats shows what each rank was given.
            argv += ["--nnodes", str(spec.nnodes), "--rank", str(spec.rank), "--leader-addr", spec.leader_addr,
                     "--leader-port", str(spec.leader_port)]
        if tls is not None:
            argv += ["--ssl-keyfile", tls.key, "--ssl-certfile", tls.cert]
        env = {**base.spec_env(spec), **base.api_key_env(self.name, spec)}
        if spec.sleep_mode:
            # As vLLM's (sim/engine/sleep.py): the flag, and the dev mode that serves /sleep and /wake_up.
            argv.append("--enable-sleep-mode")
            env["VLLM_SERVER_DEV_MODE"] = "1"
        argv += spec.args
        # The key by environment (the sim reads LLMGW_SIM_API_KEY), never argv.
        return base.Launch(argv=argv, env=env)

    def probe(self) -> str | None:
        if self._version is not None:
            return self._version
        return version()  # the sim is part of llmgw: its version is llmgw's

    def in_flight_probe(self) -> base.InFlightProbe:
        # Waiting requests count: they were accepted, and a stop would fail them as surely.
        return "/sim/stats", parse_sim_stats
