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

from llmgw.core.errors import LlmgwError

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML settings file (see examples/agent.yaml) "
                                                     "[env LLMGW_AGENT_CONFIG]")
NodeIdOpt = typer.Option(None, help="Node id [default: the hostname; once joined, the certificate's]")
MgmtAddrOpt = typer.Option(None, help="Address engines listen on [default: this machine's on the route to the "
                                      "control plane]")
StateDirOpt = typer.Option(None, help="Engine logs, state and this node's certificates (pki/) [default "
                                      "/var/lib/llmgw/agent as root, else $XDG_STATE_HOME/llmgw/agent]")
ModelDirOpt = typer.Option([], "--model-dir", help="Where model weights live (repeatable)")
HeartbeatOpt = typer.Option(None, help="Seconds between heartbeats [5]")
StopGraceOpt = typer.Option(None, help="Seconds an engine gets between SIGTERM and SIGKILL [10]")
StopEnginesOpt = typer.Option(False, "--stop-engines-on-exit", help="Stop engines when the agent stops (default: "
                                                                    "they outlive it and the next agent adopts them)")
EnginePythonOpt = typer.Option([], "--engine-python", help="ENGINE=PYTHON: the Python that has a Python engine "
                                                           "installed, e.g. vllm=/opt/vllm/bin/python (repeatable) "
                                                           "[env LLMGW_AGENT_VLLM_PYTHON, ...; default: the "
                                                           "agent's own]")
LogLevelOpt = typer.Option("info")


def register(app: typer.Typer, *, setup_logging: Callable[[str], None], fail: Callable[[str], typer.Exit]) -> None:
    """Adds ``agent`` (a command that runs the agent, with ``join`` beneath it) to ``app``."""
    agent_app = typer.Typer(help="Run the node agent on this machine; `llmgw agent join` joins it to a cluster first.")
    app.add_typer(agent_app, name="agent")

    @agent_app.callback(invoke_without_command=True)
    def agent(
        ctx: typer.Context,
        config: Path = ConfigOpt,
        server: list[str] = typer.Option([], "--server", help="Control plane agent address HOST:PORT (repeatable; "
                                                               "replaces the file's) [default: where `agent join` "
                                                               "joined]"),
        insecure: bool = typer.Option(False, "--insecure", help="Loopback development only: plaintext, no "
                                                                "certificate, against `llmgw server --insecure`"),
        node_id: str = NodeIdOpt, mgmt_addr: str = MgmtAddrOpt, state_dir: Path = StateDirOpt,
        model_dir: list[Path] = ModelDirOpt, heartbeat_interval: float = HeartbeatOpt,
        stop_grace: float = StopGraceOpt, stop_engines_on_exit: bool = StopEnginesOpt,
        engine_python: list[str] = EnginePythonOpt, log_level: str = LogLevelOpt,
    ) -> None:
        """Run the node agent on this machine (it must have joined, or be --insecure on loopback)."""
        if ctx.invoked_subcommand is not None:
            return
        flags = _flags(server=server, node_id=node_id, mgmt_addr=mgmt_addr, state_dir=state_dir,
                       model_dir=model_dir, heartbeat_interval=heartbeat_interval, stop_grace=stop_grace,
                       stop_engines_on_exit=stop_engines_on_exit, engine_python=engine_python, insecure=insecure)
        try:
            _run(config, flags, log_level=log_level, setup_logging=setup_logging)
        except LlmgwError as e:
            raise fail(str(e)) from None

    @agent_app.command("join")
    def join(
        server: str = typer.Option(..., "--server", help="The control plane's join port HOST:PORT, as `llmgw token "
                                                         "create` prints it"),
        token: str = typer.Option(..., "--token", envvar="LLMGW_JOIN_TOKEN", help="The bootstrap token "
                                  "[env LLMGW_JOIN_TOKEN]"),
        ca_hash: str = typer.Option(..., "--ca-hash", help="sha256:... of the cluster CA's public key; the server "
                                                           "is checked against it before anything is sent"),
        join_only: bool = typer.Option(False, "--join-only", help="Write the certificate and stop (do not run "
                                                                  "the agent)"),
        config: Path = ConfigOpt, node_id: str = NodeIdOpt, mgmt_addr: str = MgmtAddrOpt,
        state_dir: Path = StateDirOpt, model_dir: list[Path] = ModelDirOpt, heartbeat_interval: float = HeartbeatOpt,
        stop_grace: float = StopGraceOpt, stop_engines_on_exit: bool = StopEnginesOpt,
        engine_python: list[str] = EnginePythonOpt, log_level: str = LogLevelOpt,
    ) -> None:
        """Join this node to a cluster with a token (its key made here, its certificate stored 0600), then run it."""
        from llmgw.agent import join as join_mod
        from llmgw.agent import nodepki
        from llmgw.agent import settingsload as agent_settings

        flags = _flags(server=[], node_id=node_id, mgmt_addr=mgmt_addr, state_dir=state_dir, model_dir=model_dir,
                       heartbeat_interval=heartbeat_interval, stop_grace=stop_grace,
                       stop_engines_on_exit=stop_engines_on_exit, engine_python=engine_python, insecure=None)
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


def _flags(*, server: list[str], node_id: str | None, mgmt_addr: str | None, state_dir: Path | None,
           model_dir: list[Path], heartbeat_interval: float | None, stop_grace: float | None,
           stop_engines_on_exit: bool, engine_python: list[str], insecure: bool | None) -> dict[str, Any]:
    return {"servers": server, "node_id": node_id, "mgmt_addr": mgmt_addr,
            "state_dir": state_dir.resolve() if state_dir else None,
            "model_dirs": [p.resolve() for p in model_dir], "heartbeat_interval": heartbeat_interval,
            "stop_grace": stop_grace, "stop_engines_on_exit": True if stop_engines_on_exit else None,
            "engine_python": engine_python, "insecure": True if insecure else None}


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
    try:
        asyncio.run(agent_main.run(cfg, ring=ring))
    except rejoin.CertificateRefused as e:
        # Its own exit status: a unit file's RestartPreventExitStatus=3 keeps systemd from restarting it in vain.
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(rejoin.EXIT_CODE) from None
