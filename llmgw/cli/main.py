"""The ``llmgw`` command line: run the parts, and manage a running cluster over its REST API."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from urllib.parse import quote

import typer
from rich.console import Console

from llmgw.cli import agentcmd, getcmds, manifests, priorityflags, settingsflags
from llmgw.cli import audit as audit_mod
from llmgw.cli import backup as backup_mod
from llmgw.cli import client as client_mod
from llmgw.cli import contexts as contexts_mod
from llmgw.cli import controlplanes as controlplanes_mod
from llmgw.cli import describe as describe_mod
from llmgw.cli import engines as engines_mod
from llmgw.cli import fabric as fabric_mod
from llmgw.cli import keys as keys_mod
from llmgw.cli import login as login_mod
from llmgw.cli import logs as logs_mod
from llmgw.cli import mirror as mirror_mod
from llmgw.cli import nodes as nodes_mod
from llmgw.cli import onboard as onboard_mod
from llmgw.cli import plan as plan_mod
from llmgw.cli import projects as projects_mod
from llmgw.cli import settings as settings_mod
from llmgw.cli import sim as sim_mod
from llmgw.cli import usage as usage_mod
from llmgw.cli import users as users_mod
from llmgw.cli import version as version_mod
from llmgw.core.errors import LlmgwError
from llmgw.router.settings import RouterSettings
from llmgw.serving.settings import ServerSettings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
get_app = typer.Typer(no_args_is_help=True, help="List nodes, models, replicas, weights, keys, users, projects, "
                                                   "engines or control planes (piped: plain columns, full values).")
delete_app = typer.Typer(no_args_is_help=True, help="Delete a model (its replicas are stopped).")
app.add_typer(get_app, name="get")
app.add_typer(delete_app, name="delete")
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

UrlOpt = typer.Option(None, "--url", help="Control plane URL [env LLMGW_URL, default http://127.0.0.1:8080]")


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "llmgw"


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "httpx", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", highlight=False, markup=True)
    return typer.Exit(1)


def _client(url: str | None) -> client_mod.Client:
    return client_mod.Client(url or client_mod.default_url())


@app.command()
@settingsflags.options(ServerSettings, fail=_fail)
def server(settings: ServerSettings) -> None:
    """Run the control plane and the router."""
    from llmgw import serve

    _logging(settings.log_level)
    try:
        cfg = serve.config_of(settings, os.environ, default_data_dir=default_data_dir())
    except LlmgwError as e:
        raise _fail(str(e)) from None

    async def serve_then_exit() -> None:
        code = 0
        try:
            await serve.run(cfg)
        except LlmgwError as e:
            err_console.print(f"[red]error:[/red] {e}")
            code = 1
        except BaseException:
            logging.getLogger("llmgw").exception("llmgw server failed")
            code = 1
        # Everything is stopped by now. Exit here rather than let asyncio.run
        # cancel what is left: with many agent streams, grpc.aio joins its
        # poller thread from inside that cancellation and never returns (seen
        # with 1,000 simulated agents: cleanup done, then hung for 10 minutes).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    asyncio.run(serve_then_exit())


@app.command()
@settingsflags.options(RouterSettings, defaults={"log_level": "warning"}, fail=_fail)
def router(settings: RouterSettings) -> None:
    """Run a router alone, fed by a control plane's table; it keeps serving while the control plane is down."""
    from llmgw.router import standalone

    if settings.table_file is None and not settings.control:
        raise typer.BadParameter("the control plane's URL is required (or --table-file, a static table)",
                                 param_hint="'--control'")
    raise typer.Exit(standalone.run(settings))


@app.command()
def up(
    http_port: int = typer.Option(8080, min=0, max=65535, help="OpenAI API, REST API and /metrics"),
    agent_port: int = typer.Option(8081, min=0, max=65535, help="The agents' gRPC stream"),
    data_dir: Path = typer.Option(None, help="Database, logs and engine state [default $XDG_DATA_HOME/llmgw]"),
    model: Path = typer.Option(None, "--model", "-f", help="Model file to apply [default: SmolLM2-135M on llama.cpp]"),
    wait: float = typer.Option(600.0, help="Seconds to wait for the model to be Ready"),
) -> None:
    """Run everything on this machine: server, router, a local agent and a model."""
    from llmgw.cli import up as up_mod

    try:
        code = up_mod.run(http_port=http_port, agent_port=agent_port, data_dir=data_dir or default_data_dir(),
                          model_file=model, wait_s=wait, console=console)
    except LlmgwError as e:
        raise _fail(str(e)) from None
    raise typer.Exit(code)


@app.command()
def apply(
    file: list[str] = typer.Option(..., "--file", "-f", help="Model file (YAML; - for stdin); repeatable"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Apply nothing: show each model's metadata, memory and "
                                                          "where it would be placed, with every other node's reason"),
    url: str = UrlOpt,
) -> None:
    """Create or update the models in a file."""
    try:
        models = [m for f in file for m in manifests.load(f)]
        c = _client(url)
        if dry_run:
            for m in models:
                plan_mod.preview_manifest(c, m.to_manifest())
            return
        for m in models:
            status, _ = c.request("POST", "/api/v1/models", json=m.to_manifest())
            console.print(f"model/{m.name} {'created' if status == 201 else 'configured'}")
    except LlmgwError as e:
        raise _fail(str(e)) from None


@app.command()
def scale(
    name: str = typer.Argument(..., help="The model"),
    replicas: int = typer.Option(..., "--replicas", min=0, help="The replica count to run"),
    url: str = UrlOpt,
) -> None:
    """Set a model's replica count by hand (refused for an autoscaled model: its spec.autoscale sets it)."""
    try:
        _client(url).request("POST", f"/api/v1/models/{quote(name, safe='')}/scale", json={"replicas": replicas})
    except LlmgwError as e:
        raise _fail(str(e)) from None
    console.print(f"model/{name} scaled to {replicas} replicas")


@delete_app.command("model")
def delete_model(name: str, url: str = UrlOpt) -> None:
    """Delete a model; its replicas are stopped."""
    try:
        _client(url).request("DELETE", f"/api/v1/models/{name}")
    except LlmgwError as e:
        raise _fail(str(e)) from None
    console.print(f"model/{name} deleted")


logs_mod.register(app)
describe_mod.register(app)
engines_mod.register(app)
settings_mod.register(app)
keys_mod.register(app)
projects_mod.register(app)
priorityflags.register(app)
audit_mod.register(app)
sim_mod.register(app)
mirror_mod.register(app)
onboard_mod.register(app, default_data_dir=default_data_dir)
backup_mod.register(app, default_data_dir=default_data_dir)
agentcmd.register(app, setup_logging=_logging, fail=_fail)
nodes_mod.register(app)
plan_mod.register(app, fail=_fail)
controlplanes_mod.register(get_app)
getcmds.register(get_app)
fabric_mod.register(app)
login_mod.register(app)
contexts_mod.register(app)
users_mod.register(app)
usage_mod.register(app)
version_mod.register(app)


def main() -> None:
    # `--context NAME` anywhere on the line (kubectl's habit), for every command: taken out here into LLMGW_CONTEXT.
    sys.argv[1:] = contexts_mod.take_flag(sys.argv[1:], os.environ)
    app()
