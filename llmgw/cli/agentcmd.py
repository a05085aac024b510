"""``llmgw agent`` and ``llmgw agent join``: run the node agent, joining the cluster first when asked.

``agent join`` takes every flag ``agent`` takes, so one command line in a unit file both joins (the first
time) and runs; ``--join-only`` stops after the certificate is written. The agent's modules are imported
inside the commands: `llmgw get` must not pay for grpc and discovery.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from llmgw.agent.flags import AgentFlags
from llmgw.cli import settingsflags
from llmgw.core.errors import LlmgwError


def register(app: typer.Typer, *, setup_logging: Callable[[str], None], fail: Callable[[str], typer.Exit]) -> None:
    """Adds ``agent`` (a command that runs the agent, with ``join`` beneath it) to ``app``."""
    agent_app = typer.Typer(help="Run the node agent on this machine; `llmgw agent join` joins it to a cluster first.")
    app.add_typer(agent_app, name="agent")

    @agent_app.callback(invoke_without_command=True)
    @settingsflags.options(AgentFlags, fail=fail, group=True)
    def agent(flags: AgentFlags) -> None:
        """Run the node agent on this machine (it must have joined, or be --insecure on loopback)."""
        try:
            _run(flags.config, flags.settings(), log_level=flags.log_level, setup_logging=setup_logging)
        except LlmgwError as e:
            raise fail(str(e)) from None

    @agent_app.command("join")
    @settingsflags.options(AgentFlags, fail=fail, skip=("servers", "insecure"))
    def join(
        given: AgentFlags,
        server: str = typer.Option(..., "--server", help="The control plane's join port HOST:PORT, as `llmgw token "
                                                         "create` prints it"),
        token: str = typer.Option(..., "--token", envvar="LLMGW_JOIN_TOKEN", help="The bootstrap token "
                                  "[env LLMGW_JOIN_TOKEN]"),
        ca_hash: str = typer.Option(..., "--ca-hash", help="sha256:... of the cluster CA's public key; the server "
                                                           "is checked against it before anything is sent"),
        join_only: bool = typer.Option(False, "--join-only", help="Write the certificate and stop (do not run "
                                                                  "the agent)"),
    ) -> None:
        """Join this node to a cluster with a token (its key made here, its certificate stored 0600), then run it."""
        from llmgw.agent import join as join_mod
        from llmgw.agent import nodepki
        from llmgw.agent import settingsload as agent_settings

        flags, config, log_level = given.settings(), given.config, given.log_level
        setup_logging(log_level)
        try:
            # The settings as the agent will read them, for the state directory and the node id asked for;
            # the join address stands in for the agent's servers, which the join itself finds.
            st = agent_settings.load(path=_config_path(config), env=os.environ, flags={**flags, "servers": [server]})
            assert st.state_dir is not None
            if not join_only and (found := nodepki.of(st.state_dir)) is not None:
                # A unit file runs `agent join ...` with Restart=always: from the second start on the node has
                # joined, and refusing (exit 1) made every restart fail. The token is not sent anywhere.
                typer.echo(f"{nodepki.already_joined(found).split(';')[0]}: the token is ignored; running the agent "
                           "with its certificate", err=True)
                _run(config, flags, log_level=log_level, setup_logging=None)
                return
            joined = join_mod.join(server=st.servers[0], token=token, ca_hash=ca_hash,
                                   node_id=st.node_id or socket.gethostname(), state_dir=st.state_dir)
            typer.echo(f"joined as node {joined.node_id}; certificate in {joined.pki.dir}; the agent stream is at "
                       f"{joined.servers[0]}", err=True)
            if join_only:
                return
            _run(config, {**flags, "node_id": joined.node_id}, log_level=log_level, setup_logging=None)
        except LlmgwError as e:
            raise fail(str(e)) from None


def _config_path(config: Path | None) -> Path | None:
    return config or (Path(os.environ["LLMGW_AGENT_CONFIG"]) if os.environ.get("LLMGW_AGENT_CONFIG") else None)


def _resume_upgrade(state_dir: Path) -> None:
    """An earlier `llmgw node upgrade` moved this node to a newer llmgw than this one: re-execute into it now."""
    from llmgw.agent import selfupgrade
    from llmgw.core.version import version

    python = selfupgrade.resume_python(state_dir, version())
    if python is not None:
        typer.echo(f"this node's agent was upgraded to the llmgw in {python.parent.parent} (llmgw {version()} was "
                   f"started); running that one (remove {state_dir / selfupgrade.DIR / selfupgrade.CURRENT} to run "
                   "the one started)", err=True)
        selfupgrade.exec_into(python)


def _run(config: Path | None, flags: dict[str, Any], *, log_level: str,
         setup_logging: Callable[[str], None] | None) -> None:
    from llmgw.agent import config as agent_config
    from llmgw.agent import join as join_mod
    from llmgw.agent import main as agent_main
    from llmgw.agent import rejoin
    from llmgw.agent import settingsload as agent_settings

    if setup_logging is not None:
        setup_logging(log_level)  # first: basicConfig does nothing once the root logger has a handler (the ring)
    ring = agent_main.install_log_ring()
    st = agent_settings.load(path=_config_path(config), env=os.environ, flags=flags)
    cfg = agent_config.from_settings(st)
    join_mod.check_mode(cfg.servers, tls=cfg.tls is not None)
    _resume_upgrade(cfg.state_dir)
    try:
        upgraded = asyncio.run(agent_main.run(cfg, ring=ring))
    except rejoin.CertificateRefused as e:
        # Its own exit status: a unit file's RestartPreventExitStatus=3 keeps systemd from restarting it in vain.
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(rejoin.EXIT_CODE) from None
    if upgraded is not None:  # `llmgw node upgrade`: the same process, the new llmgw, the engines adopted
        from llmgw.agent import selfupgrade

        selfupgrade.exec_into(upgraded)
