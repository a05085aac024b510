"""``llmgw get nodes|models|replicas|weights|keys|users|projects|engines|routertokens``: every listing through
``cli.output`` (``-o``, ``--no-headers``, ``--sort-by``, ``--selector``) and ``cli.watch`` (``--watch``).

``--selector`` is applied here, on the items' labels: the REST API lists everything and has no label query.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import typer

from llmgw.cli import client as client_mod
from llmgw.cli import engines as engines_mod
from llmgw.cli import keys as keys_mod
from llmgw.cli import projects as projects_mod
from llmgw.cli import tables
from llmgw.cli import users as users_mod
from llmgw.cli.output import Format, Listing, View, show
from llmgw.cli.watch import watch
from llmgw.core.errors import LlmgwError

URL_OPT = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")
OUTPUT_OPT = typer.Option(Format.table, "-o", "--output",
                          help="table, wide (more columns), json, yaml, or name (KIND/NAME a line)")
NO_HEADERS_OPT = typer.Option(False, "--no-headers", help="Rows only, no header line")
SORT_OPT = typer.Option("", "--sort-by", help="A column (NODE, 'LAST USED') or a field (.status.ready_replicas)")
SELECTOR_OPT = typer.Option("", "-l", "--selector",
                            help="Labels: key=value,key!=value,key,!key (nodes and models; matched by the CLI)")
WATCH_OPT = typer.Option(False, "-w", "--watch", help="After the list, print each row again when it changes "
                                                      "(Ctrl-C ends it)")


@dataclass(frozen=True, slots=True)
class Flags:
    view: View
    watch: bool
    url: str | None

    def client(self) -> client_mod.Client:
        return client_mod.Client(self.url or client_mod.default_url())


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def run(listing: Listing, fetch: Callable[[client_mod.Client], list[Any]], flags: Flags, *, empty: str = "") -> None:
    """List (or watch) with ``fetch``; an error is its sentence on stderr and exit status 1."""
    try:
        client = flags.client()
        if flags.watch:
            watch(lambda: fetch(client), listing, flags.view)
        else:
            show(fetch(client), listing, flags.view, empty=empty)
    except LlmgwError as e:
        raise _fail(str(e)) from None


def _flags(output: Format, no_headers: bool, sort_by: str, selector: str, watching: bool, url: str | None) -> Flags:
    return Flags(View(output=output, headers=not no_headers, sort_by=sort_by, selector=selector), watching, url)


def _items(path: str) -> Callable[[client_mod.Client], list[Any]]:
    return lambda c: list(c.get(path)["items"])


def register(get_app: typer.Typer) -> None:
    """Adds the listings to the ``get`` group."""

    @get_app.command("nodes")
    def get_nodes(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                  selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Nodes that registered, connected or not (-o wide: with their pools, engine installs and labels)."""
        def fetch(c: client_mod.Client) -> list[Any]:
            items = c.get("/api/v1/nodes")["items"]
            return tables.with_installs(items, c.get("/api/v1/engines")) if output is Format.wide else items

        run(tables.NODES, fetch, _flags(output, no_headers, sort_by, selector, watching, url))

    @get_app.command("models")
    def get_models(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                   selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Models and whether they are Ready."""
        run(tables.MODELS, _items("/api/v1/models"), _flags(output, no_headers, sort_by, selector, watching, url))

    @get_app.command("adapters")
    def get_adapters(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                     watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """LoRA adapters: each model's, from its file (APPLIED AS Model) or applied on their own (Adapter)."""
        run(tables.ADAPTERS, _items("/api/v1/adapters"), _flags(output, no_headers, sort_by, "", watching, url))

    @get_app.command("replicas")
    def get_replicas(model: str = typer.Option(None, help="Only this model's replicas"),
                     output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                     selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Replicas: where each runs and what it is doing."""
        path = "/api/v1/replicas" + (f"?model={quote(model, safe='')}" if model else "")
        run(tables.REPLICAS, _items(path), _flags(output, no_headers, sort_by, selector, watching, url))

    @get_app.command("weights")
    def get_weights(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                    selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Weights on each node: size, source, last use, whether llmgw fetched it, and which models ask for it."""
        run(tables.weights(), _items("/api/v1/weights"), _flags(output, no_headers, sort_by, selector, watching, url))

    @get_app.command("keys")
    def get_keys(project: str = typer.Option("", "--project", help="Only this project's keys"),
                 output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                 selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """API keys you may see (never their secrets); the same as `llmgw key list`."""
        path = f"/api/v1/keys?project={quote(project, safe='')}" if project else "/api/v1/keys"
        run(keys_mod.listing(), _items(path), _flags(output, no_headers, sort_by, selector, watching, url))

    @get_app.command("users")
    def get_users(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                  selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Users and their roles (administrators only); the same as `llmgw user list`."""
        run(users_mod.USERS, _items("/api/v1/users"), _flags(output, no_headers, sort_by, selector, watching, url))

    @get_app.command("routertokens")
    def get_router_tokens(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                          selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Routers with a credential (never the secret); the same as `llmgw router-token list`."""
        run(users_mod.ROUTERS, _items("/api/v1/routers"), _flags(output, no_headers, sort_by, selector, watching,
                                                                 url))

    @get_app.command("projects")
    def get_projects(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                     selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Projects you may see; the same as `llmgw project list`."""
        run(projects_mod.PROJECTS, _items("/api/v1/projects"), _flags(output, no_headers, sort_by, selector,
                                                                      watching, url))

    @get_app.command("engines")
    def get_engines(output: Format = OUTPUT_OPT, no_headers: bool = NO_HEADERS_OPT, sort_by: str = SORT_OPT,
                    selector: str = SELECTOR_OPT, watching: bool = WATCH_OPT, url: str = URL_OPT) -> None:
        """Engine installs on each node and their state (`llmgw engine list` adds the wants and the index)."""
        run(engines_mod.INSTALLS, lambda c: engines_mod.install_items(c.get("/api/v1/engines")),
            _flags(output, no_headers, sort_by, selector, watching, url))
