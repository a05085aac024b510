"""The sim engine adapter: ``python -m llmgw.sim.engine``, installed wherever llmgw is."""

from __future__ import annotations

import importlib.metadata
import json
import sys

from llmgw.agent.engines import base
from llmgw.core import shards

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
    """Adapter for llmgw's simulated engine."""

    name = "sim"
    health_path = "/health"

    def validate(self, spec: shards.ShardSpec) -> None:
        base.check_common(self.name, spec)

    def launch(self, spec: shards.ShardSpec, *, host: str, port: int, model_path: str | None,
               cpu_count: int, python: str = sys.executable) -> base.Launch:
        # model_path and cpu_count are unused: the sim loads nothing and spins no threads.
        self.validate(spec)
        argv = [python, "-m", MODULE, "--host", host, "--port", str(port), "--model", spec.served_name]
        if spec.api_key:
            argv += ["--api-key", spec.api_key]
        if spec.nnodes > 1:
            # The sim has no collective to join; it takes its rank so that a
            # worker rank refuses the API (only the leader serves it) and
            # /sim/stats shows what each rank was given.
            argv += ["--nnodes", str(spec.nnodes), "--rank", str(spec.rank), "--leader-addr", spec.leader_addr,
                     "--leader-port", str(spec.leader_port)]
        argv += spec.args
        return base.Launch(argv=argv, env=base.spec_env(spec))

    def probe(self) -> str | None:
        try:
            return importlib.metadata.version("llmgw")
        except importlib.metadata.PackageNotFoundError:
            # Run from a source tree that was never installed.
            return "dev"

    def in_flight_probe(self) -> base.InFlightProbe:
        # Waiting requests count: they were accepted, and a stop would fail them as surely.
        return "/sim/stats", parse_sim_stats
