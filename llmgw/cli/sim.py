"""``llmgw sim fleet``: many simulated agents against a real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

import typer

sim_app = typer.Typer(no_args_is_help=True, help="Simulators for trying llmgw at scale without the hardware.")


@sim_app.command("fleet")
def fleet(
    server: str = typer.Option("127.0.0.1:8081", "--server",
                               help="The control plane's agent address HOST:PORT, or several comma-separated (a "
                                    "leader and its standbys: nodes start at the first, follow a standby's "
                                    "refusal to the leader it names, and move on when one fails)"),
    nodes: int = typer.Option(100, "--nodes", min=1, max=100_000, help="How many simulated nodes"),
    mix: str = typer.Option("h100:0.3,l40s:0.3,cpu:0.4", "--mix", help="Node kinds and weights"),
    heartbeat: float = typer.Option(5.0, "--heartbeat", min=0.1, help="Seconds between each node's heartbeats"),
    seed: int = typer.Option(0, "--seed", help="Which nodes get which kind"),
    stats_file: Path = typer.Option(None, "--stats-file",
                                    help="Write counts (registered, commands received, heartbeats and how late "
                                         "they went out) here as JSON twice a second, for benchmarks"),
    streams_per_channel: int = typer.Option(100, "--streams-per-channel", min=1,
                                            help="Agent streams multiplexed on one HTTP/2 connection"),
) -> None:
    """Run N simulated agents (fake inventories, shards Ready without an engine) until Ctrl-C."""
    from llmgw.sim import fleet as fleet_mod

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        parsed = fleet_mod.parse_mix(mix)
        servers = fleet_mod.parse_servers(server)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stats = fleet_mod.Stats()
        agents = fleet_mod.build_fleet(nodes, parsed, heartbeat_s=heartbeat, stats=stats, seed=seed)
        await fleet_mod.run(servers, agents, stop=stop, stats_file=stats_file,
                            streams_per_channel=streams_per_channel)

    async def main_then_exit() -> None:
        with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
            await main()
        # As in `llmgw server`: with a thousand streams, grpc.aio can hang inside asyncio.run's
        # final cancellation (seen: the simulator outlived its SIGTERM), so exit once stopped.
        logging.shutdown()
        os._exit(0)

    asyncio.run(main_then_exit())


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
