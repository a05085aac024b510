"""The ``llmgw`` command line: run the parts, and manage a running cluster over its REST API."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import sys
from pathlib import Path
from urllib.parse import quote

import typer
from rich.console import Console

from llmgw.cli import agentcmd, httplimits, manifests, tables
from llmgw.cli import audit as audit_mod
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
from llmgw.cli import settings as settings_mod
from llmgw.cli import sim as sim_mod
from llmgw.cli import users as users_mod
from llmgw.core import units
from llmgw.core.errors import LlmgwError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
get_app = typer.Typer(no_args_is_help=True, help="List nodes, models or replicas.")
delete_app = typer.Typer(no_args_is_help=True, help="Delete a model (its replicas are stopped).")
app.add_typer(get_app, name="get")
app.add_typer(delete_app, name="delete")
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)

TracingOpt = typer.Option("", "--tracing-endpoint", envvar="LLMGW_TRACING_ENDPOINT",
                          help="Export the router's OpenTelemetry spans over OTLP/HTTP to this collector, "
                               "e.g. http://127.0.0.1:4318 [default: off]")
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


class Output(enum.StrEnum):
    table = "table"
    json = "json"


@app.command()
def server(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 for every interface)"),
    http_port: int = typer.Option(8080, min=0, max=65535, help="OpenAI API, REST API and /metrics"),
    agent_port: int = typer.Option(8081, min=0, max=65535, help="The agents' gRPC stream (mutual TLS)"),
    join_port: int = typer.Option(8082, min=0, max=65535, help="Where `llmgw agent join` reaches this server "
                                  "with a token (TLS; not with --insecure)"),
    data_dir: Path = typer.Option(None, help="Database and cluster CA directory, initialised on first start "
                                  "[default $XDG_DATA_HOME/llmgw]"),
    ports_file: Path = typer.Option(None, help="Write the bound ports here as JSON once listening"),
    database: str = typer.Option("", "--database", envvar="LLMGW_DATABASE", help="The store's database URL, "
                                 "e.g. postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DB (migrated at start, "
                                 "once under a lock) [default: SQLite in the data directory]"),
    advertise_address: str = typer.Option("", help="The host other machines reach this server by: agents are "
                                          "sent to HOST:AGENT_PORT and a standby forwards the REST API to "
                                          "http://HOST:HTTP_PORT when this one leads [default: --host, or this "
                                          "machine's FQDN when --host is a wildcard]"),
    lease: str = typer.Option("6s", help="How long the leader's lease lasts past its last renewal: a dead leader "
                              "is replaced within about this long (several servers on one --database)"),
    lease_renew: str = typer.Option("1s", help="How often the leader renews its lease and a standby tries to "
                                    "take it"),
    insecure: bool = typer.Option(False, "--insecure", help="Loopback development only: no authentication on the "
                                  "REST API, a plaintext agent stream, no join port (refused with a --host that "
                                  "is not loopback)"),
    node_cert_validity: str = typer.Option("365d", help="How long a node's certificate is valid, e.g. "
                                           "720h, 30s; "
                                           "agents renew it at two thirds, over their stream"),
    node_grace: float = typer.Option(30.0, help="Seconds a disconnected node keeps its replicas"),
    unhealthy_grace: float = typer.Option(30.0, help="Seconds a replica whose engine its agent calls Unhealthy "
                                          "(alive, not answering) stays so before it is replaced"),
    weights_gc_free_below: float = typer.Option(10.0, help="Remove fetched weights no model asks for, least "
                                                "recently used first, from a node whose weights directory has "
                                                "less than this percent free (0: never)"),
    hub_endpoint: str = typer.Option("", help="The Hugging Face-compatible endpoint nodes fetch hf:// sources "
                                     "from: the hub, or the cluster's mirror [default: this server's /mirror with "
                                     "--mirror-dir, else https://huggingface.co]"),
    mirror_url: str = typer.Option("", help="The cluster mirror's base URL, for mirror:// sources [default: this "
                                   "server's /mirror with --mirror-dir]"),
    mirror_dir: Path = typer.Option(None, help="Serve this directory of weights as the cluster's mirror at /mirror "
                                    "on the HTTP port (admin API token from LLMGW_MIRROR_ADMIN_TOKEN) [default: "
                                    "no mirror here]"),
    mirror_upstream: str = typer.Option("", help="With --mirror-dir: pull missing files through from this "
                                        "HF-compatible endpoint, once per file for the cluster, e.g. "
                                        "https://huggingface.co [default: off]"),
    fetch_allow_private: list[str] = typer.Option([], "--fetch-allow-private", help="A host or HOST:PORT the "
                                                  "control plane's reads of remote sources may reach although it "
                                                  "is loopback, link-local or this host's own ('*': any); "
                                                  "repeatable [default: none; the hub and mirror are trusted]"),
    hub_token_file: Path = typer.Option(None, help="A file holding the hub's token, sent only to nodes fetching an "
                                        "hf:// source (without it: the LLMGW_HF_TOKEN environment variable); a "
                                        "token is never given on the command line"),
    engine_index: str = typer.Option(None, help="The package index nodes install engines from: a pip simple index "
                                     "URL, or with --engine-find-links a wheelhouse page (the llmgw mirror's); "
                                     "never the public index unless named here [given: stored, and wins over the "
                                     "stored value; default: the stored value, else none]"),
    engine_find_links: bool = typer.Option(False, "--engine-find-links", help="With --engine-index: it is a page "
                                           "of wheel links (pip --find-links), not a simple index"),
    model_installs: bool = typer.Option(None, "--model-installs/--no-model-installs", help="Whether a model's "
                                        "engine_version makes a node that lacks it install it [given: stored, and "
                                        "wins; default: the stored value, else yes]"),
    engine_os_packages: bool = typer.Option(None, "--engine-os-packages/--no-engine-os-packages",
                                            help="Whether agents running as root install the OS packages an "
                                            "engine (or perftest) needs with apt-get/dnf; otherwise they report "
                                            "them with the command [given: stored, and wins; default: the stored "
                                            "value, else no]"),
    header_timeout: float = httplimits.HeaderTimeoutOpt, body_timeout: float = httplimits.BodyTimeoutOpt,
    idle_timeout: float = httplimits.IdleTimeoutOpt, max_connections_per_address: int = httplimits.MaxPerAddressOpt,
    tracing_endpoint: str = TracingOpt,
    audit_retention: str = typer.Option("90d", help="How long the audit log keeps an entry, e.g. 90d, 720h; the "
                                        "leader deletes older ones"),
    log_level: str = typer.Option("info"),
) -> None:
    """Run the control plane and the router."""
    from llmgw import serve

    _logging(log_level)
    if node_grace < 0:
        raise _fail("--node-grace cannot be negative")
    if unhealthy_grace < 0:
        raise _fail("--unhealthy-grace cannot be negative")
    if not 0 <= weights_gc_free_below < 100:
        raise _fail(f"--weights-gc-free-below {weights_gc_free_below:g}: a percent from 0 (never) to below 100")
    if tracing_endpoint and not tracing_endpoint.startswith(("http://", "https://")):
        raise _fail(f"--tracing-endpoint {tracing_endpoint!r}: expected http://HOST:PORT of an OTLP/HTTP collector")
    try:
        cert_validity_s = units.parse_duration(node_cert_validity)
    except ValueError as e:
        raise _fail(f"--node-cert-validity: {e}") from None
    if cert_validity_s <= 0:
        raise _fail("--node-cert-validity must be longer than 0s")
    try:
        audit_retention_s = units.parse_duration(audit_retention)
    except ValueError as e:
        raise _fail(f"--audit-retention: {e}") from None
    if audit_retention_s <= 0:
        raise _fail("--audit-retention must be longer than 0s, e.g. 90d")
    try:
        lease_timing = serve.lease_timing(lease=units.parse_duration(lease), renew=units.parse_duration(lease_renew))
    except (ValueError, LlmgwError) as e:
        raise _fail(f"--lease/--lease-renew: {e}") from None
    try:
        hub = serve.hub_settings(endpoint=hub_endpoint, mirror_url=mirror_url, token_file=hub_token_file,
                                 env=os.environ, quiet=mirror_dir is not None)
    except LlmgwError as e:
        raise _fail(str(e)) from None
    if engine_find_links and engine_index is None:
        raise _fail("--engine-find-links says what --engine-index is: give --engine-index URL with it")
    if engine_index is not None and engine_index and not engine_index.startswith(("http://", "https://", "file:")):
        raise _fail(f"--engine-index {engine_index!r}: expected an http(s):// URL of a pip index or wheelhouse page")
    if mirror_upstream and mirror_dir is None:
        raise _fail("--mirror-upstream needs --mirror-dir: the directory the mirror keeps what it pulls through")
    if mirror_upstream and not mirror_upstream.startswith(("http://", "https://")):
        raise _fail(f"--mirror-upstream {mirror_upstream!r}: expected http(s)://HOST[:PORT], e.g. "
                    "https://huggingface.co")
    mirror = None if mirror_dir is None else serve.MirrorConfig(
        dir=mirror_dir, upstream=mirror_upstream, admin_token=os.environ.get(mirror_mod.TOKEN_ENV, "").strip(),
        serves_hub=not hub_endpoint, serves_files=not mirror_url)
    cfg = serve.ServerConfig(hub=hub, mirror=mirror, host=host, http_port=http_port, agent_port=agent_port,
                             data_dir=data_dir or default_data_dir(), ports_file=ports_file, node_grace_s=node_grace,
                             unhealthy_grace_s=unhealthy_grace, tracing_endpoint=tracing_endpoint or "",
                             weights_gc_free_below_pct=weights_gc_free_below, insecure=insecure,
                             join_port=join_port, node_cert_validity_s=cert_validity_s,
                             audit_retention_s=audit_retention_s,
                             engine_index=engine_index, engine_find_links=engine_find_links,
                             model_installs=model_installs, engine_os_packages=engine_os_packages,
                             database=database, advertise=advertise_address, lease=lease_timing,
                             fetch_allow_private=tuple(fetch_allow_private),
                             http_limits=httplimits.limits(header_timeout, body_timeout, idle_timeout,
                                                           max_connections_per_address))

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
def router(
    control: str = typer.Option(..., "--control", help="The control plane's URL, e.g. http://cp1:8080, "
                                 "or several, comma-separated (a leader and its standbys): the next is followed "
                                 "when one fails"),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (0.0.0.0 for every interface)"),
    port: int = typer.Option(8080, min=0, max=65535, help="The OpenAI API (/v1) and /metrics"),
    router_id: str = typer.Option("", help="This router's name in the ejections it reports [default: hostname]"),
    token_file: Path = typer.Option(None, help="A file holding this router's credential (`llmgw router-token "
                                    "create NAME`) [default: env LLMGW_ROUTER_TOKEN]"),
    header_timeout: float = httplimits.HeaderTimeoutOpt, body_timeout: float = httplimits.BodyTimeoutOpt,
    idle_timeout: float = httplimits.IdleTimeoutOpt, max_connections_per_address: int = httplimits.MaxPerAddressOpt,
    tracing_endpoint: str = TracingOpt,
    log_level: str = typer.Option("warning"),
) -> None:
    """Run a router alone, fed by a control plane's table; it keeps serving while the control plane is down."""
    from llmgw.router import standalone

    raise typer.Exit(standalone.main(["--control", control, "--host", host, "--port", str(port),
                                      "--log-level", log_level, "--router-id", router_id,
                                      "--tracing-endpoint", tracing_endpoint or "",
                                      *httplimits.argv(header_timeout, body_timeout, idle_timeout,
                                                       max_connections_per_address),
                                      *(["--token-file", str(token_file)] if token_file else [])]))


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
    url: str = UrlOpt,
) -> None:
    """Create or update the models in a file."""
    try:
        models = [m for f in file for m in manifests.load(f)]
        c = _client(url)
        for m in models:
            status, _ = c.request("POST", "/api/v1/models", json=m.to_manifest())
            console.print(f"model/{m.name} {'created' if status == 201 else 'configured'}")
    except LlmgwError as e:
        raise _fail(str(e)) from None


def _get(path: str, output: Output, url: str | None, render: object) -> None:
    try:
        items = _client(url).get(path)["items"]
    except LlmgwError as e:
        raise _fail(str(e)) from None
    if output is Output.json:
        console.print_json(json.dumps(items))
    else:
        console.print(render(items))  # type: ignore[operator]


class NodesOutput(enum.StrEnum):
    table = "table"
    json = "json"
    wide = "wide"  # with each node's pool and engine installs


@get_app.command("nodes")
def get_nodes(output: NodesOutput = typer.Option(NodesOutput.table, "-o", "--output"), url: str = UrlOpt) -> None:
    """Nodes that registered, connected or not (-o wide: with their pools and engine installs)."""
    if output is not NodesOutput.wide:
        _get("/api/v1/nodes", Output(output.value), url, tables.nodes)
        return
    try:
        client = _client(url)
        items, installs = client.get("/api/v1/nodes")["items"], client.get("/api/v1/engines")
    except LlmgwError as e:
        raise _fail(str(e)) from None
    console.print(tables.nodes_wide(items, installs))


@get_app.command("models")
def get_models(output: Output = typer.Option(Output.table, "-o", "--output"), url: str = UrlOpt) -> None:
    """Models and whether they are Ready."""
    _get("/api/v1/models", output, url, tables.models)


@get_app.command("replicas")
def get_replicas(model: str = typer.Option(None, help="Only this model's replicas"),
                 output: Output = typer.Option(Output.table, "-o", "--output"), url: str = UrlOpt) -> None:
    """Replicas: where each runs and what it is doing."""
    _get("/api/v1/replicas" + (f"?model={model}" if model else ""), output, url, tables.replicas)


@get_app.command("weights")
def get_weights(output: Output = typer.Option(Output.table, "-o", "--output"), url: str = UrlOpt) -> None:
    """Weights on each node: size, source, last use, whether llmgw fetched it, and which models ask for it."""
    _get("/api/v1/weights", output, url, tables.weights)


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
audit_mod.register(app)
sim_mod.register(app)
mirror_mod.register(app)
onboard_mod.register(app, default_data_dir=default_data_dir)
agentcmd.register(app, setup_logging=_logging, fail=_fail)
nodes_mod.register(app)
controlplanes_mod.register(get_app)
fabric_mod.register(app)
login_mod.register(app)
contexts_mod.register(app)
users_mod.register(app)


def main() -> None:
    # `--context NAME` anywhere on the line (kubectl's habit), for every command: taken out here into LLMGW_CONTEXT.
    sys.argv[1:] = contexts_mod.take_flag(sys.argv[1:], os.environ)
    app()
