"""``llmgw sim fleet``: many simulated agents against a real control plane."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from llmgw.sim import fleet as fleet_mod

sim_app = typer.Typer(no_args_is_help=True, help="Simulators for trying llmgw at scale without the hardware.")
log = logging.getLogger("llmgw.sim.fleet")


@sim_app.command("fleet")
def fleet(
    server: str = typer.Option("", "--server",
                               help="The control plane's agent address HOST:PORT, or several comma-separated (a "
                                    "leader and its standbys: nodes start at the first, follow a standby's "
                                    "refusal to the leader it names, and move on when one fails) [default: "
                                    "with --token, the join port's host and the agent port it names; else "
                                    "127.0.0.1:8081]"),
    nodes: int = typer.Option(100, "--nodes", min=1, max=100_000, help="How many simulated nodes"),
    mix: str = typer.Option("h100:0.3,l40s:0.3,cpu:0.4", "--mix", help="Node kinds and weights"),
    heartbeat: float = typer.Option(5.0, "--heartbeat", min=0.1, help="Seconds between each node's heartbeats"),
    seed: int = typer.Option(0, "--seed", help="Which nodes get which kind"),
    prefix: str = typer.Option("sim", "--prefix", help="Node ids are PREFIX-00000, PREFIX-00001, ..."),
    token: str = typer.Option("", "--token", envvar="LLMGW_JOIN_TOKEN",
                              help="A join token with at least --nodes uses (`llmgw token create --uses N`): each "
                                   "node joins with it, gets a certificate and dials with mutual TLS"),
    ca_hash: str = typer.Option("", "--ca-hash", help="The cluster CA's hash, as `llmgw token create` prints it"),
    join: str = typer.Option("", "--join", help="The join port HOST:PORT [default: --server's host, port 8082]"),
    join_in_flight: int = typer.Option(64, "--join-in-flight", min=1, help="Joins in flight at once"),
    dial_in_flight: int = typer.Option(0, "--dial-in-flight", min=0,
                                       help="Registrations in flight at once, from the dial (with TLS, a handshake "
                                            "each) to the answer; 0: no bound, every node dials when it is ready, "
                                            "as real agents do"),
    state_dir: Path = typer.Option(None, "--state-dir",
                                   help="Keep the nodes' keys and certificates here (one 0600 file), so a fleet "
                                        "run again against the same cluster does not join again"),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="Dial plaintext, for a control plane run with --insecure (the default "
                                       "without --token)"),
    stats_file: Path = typer.Option(None, "--stats-file",
                                    help="Write counts (registered, commands received, heartbeats and how late "
                                         "they went out) here as JSON twice a second, for benchmarks"),
    streams_per_channel: int = typer.Option(100, "--streams-per-channel", min=1,
                                            help="Agent streams multiplexed on one HTTP/2 connection (plaintext "
                                                 "only: with TLS each node has its own connection)"),
) -> None:
    """Run N simulated agents (fake inventories, shards Ready without an engine) until Ctrl-C."""
    from llmgw.sim import fleet as fleet_mod
    from llmgw.sim import identity

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secure = bool(token or ca_hash)
    problem = ""
    if secure and insecure:
        problem = "--insecure dials plaintext, --token/--ca-hash join with TLS: give one or the other"
    elif secure and not (token and ca_hash):
        problem = ("give --token and --ca-hash together (`llmgw token create --uses N` prints both), or neither "
                   "with --insecure")
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    try:
        parsed = fleet_mod.parse_mix(mix)
        servers = fleet_mod.parse_servers(server) if server else ()
        join_addr = fleet_mod.parse_servers(join)[0] if join else ""
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        stats = fleet_mod.Stats()
        agents = fleet_mod.build_fleet(nodes, parsed, heartbeat_s=heartbeat, stats=stats, seed=seed, prefix=prefix)
        if secure:
            addrs, ca_pem = await _onboard(agents, stats, servers=servers, join_addr=join_addr, token=token,
                                           ca_hash=ca_hash, state_dir=state_dir, join_in_flight=join_in_flight)
            await identity.check_tls(addrs)
        else:
            addrs, ca_pem = servers or ("127.0.0.1:8081",), None
            await identity.check_plaintext(addrs)
        log.info("fleet: %d nodes dialling %s with %s", len(agents), ",".join(addrs),
                 "mutual TLS" if ca_pem else "plaintext")
        await fleet_mod.run(addrs, agents, stop=stop, stats_file=stats_file, streams_per_channel=streams_per_channel,
                            ca_pem=ca_pem, dial_in_flight=dial_in_flight)

    async def main_then_exit() -> None:
        code = 0
        try:
            with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
                await main()
        except identity.FleetError as e:
            log.error("%s", e)
            typer.echo(f"error: {e}", err=True)
            code = 1
        # As in `llmgw server`: with a thousand streams, grpc.aio can hang inside asyncio.run's
        # final cancellation (seen: the simulator outlived its SIGTERM), so exit once stopped.
        logging.shutdown()
        os._exit(code)

    asyncio.run(main_then_exit())


async def _onboard(agents: list[fleet_mod.FakeAgent], stats: fleet_mod.Stats, *, servers: tuple[str, ...],
                   join_addr: str, token: str, ca_hash: str, state_dir: Path | None,
                   join_in_flight: int) -> tuple[tuple[str, ...], bytes]:
    """Joins the nodes that have no certificate yet; the agent addresses and the cluster CA."""
    from llmgw.sim import identity

    addr = join_addr or f"{(servers[0] if servers else '127.0.0.1:8081').rpartition(':')[0]}:8082"
    ca_pem = await identity.cluster_ca(addr, ca_hash)
    kept = identity.load(state_dir) if state_dir is not None else None
    if kept is not None and kept.ca_pem != ca_pem:
        raise identity.FleetError(f"the identities in {state_dir} are another cluster's (their CA is not the one "
                                  f"{addr} presents): give another --state-dir, or remove it to join afresh")
    trust = kept or identity.Trust(ca_pem, ())
    missing = [a.node_id for a in agents if a.node_id not in trust.identities]
    if missing:
        t0 = time.monotonic()
        joined, agent_port = await identity.join_all(missing, join_addr=addr, token=token, ca_pem=ca_pem,
                                                     in_flight=join_in_flight)
        stats.joined, stats.join_s = len(joined), round(time.monotonic() - t0, 3)
        trust.identities.update(joined)
        host = addr.rpartition(":")[0]
        trust.servers = (f"{host}:{agent_port}",)
        if state_dir is not None:
            identity.save(state_dir, trust)
    for a in agents:
        a.identity = trust.identities[a.node_id]
    return servers or trust.servers, ca_pem


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
