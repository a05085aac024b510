"""The route table: which engines serve which model, as the control plane last said.

A ``RouteTable`` is an immutable snapshot built from the control plane's endpoints
document (``llmgw.api.routing.EndpointsDoc``: the object in process, its JSON from
``GET /api/v1/endpoints``), which does the reading. The router never edits one: the watcher
builds a new table and swaps it into a ``TableHolder`` with one assignment, so a
request that looked a model up keeps a consistent view (its endpoints, state and
message all from the same version) even while a newer table arrives.

A model is found by its llmgw name, its served name or any alias. When two models
claim the same name, names and served names win over aliases and the first model
in the document wins among equals: a stray alias must not steal an existing
model's traffic.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from llmgw.api import routing
from llmgw.core import quota
from llmgw.core.errors import LlmgwError
from llmgw.router import pick
from llmgw.router.auth import Authenticator

log = logging.getLogger(__name__)

#: Unknown ``routing`` values already warned about: the table arrives again on every
#: replica change, and a warning per table would bury the first one.
_warned_routings: set[str] = set()


class TableError(LlmgwError):
    """The endpoints document is not what the router understands; the message says where."""


#: One ready engine the router may send a model's requests to: the wire's own record.
Endpoint = routing.EndpointDoc
#: A replica out of routing because its engine stopped answering (``hung`` re-sends what waits there).
Unhealthy = routing.UnhealthyDoc
#: What the router needs of a model's ``spec.autoscale``: its bounds, and how long to hold at zero.
RouteAutoscale = routing.AutoscaleHint


@dataclasses.dataclass(frozen=True, slots=True)
class ModelRoute:
    """A model as the router sees it: its names, its ready endpoints, and why there are none."""

    name: str
    served_name: str
    aliases: tuple[str, ...] = ()
    state: str = ""  # a word: Ready, Starting, Pending, Failed, Degraded
    message: str = ""  # a sentence a person can act on
    endpoints: tuple[Endpoint, ...] = ()
    created: int = 0
    routing: str = pick.DEFAULT_ROUTING  # one of pick.ROUTINGS
    #: Requests this router sends one endpoint at a time (``limits.concurrency_per_replica``); 0: no limit.
    replica_limit: int = 0
    #: The engine its replicas run (``spec.engine``: llamacpp, vllm, sglang, sim), "" when not said:
    #: what engine-specific fields the router may add (``request.with_progress``).
    engine: str = ""
    #: Replicas left out of ``endpoints`` because their engine does not answer its health probe.
    #: Unlike a replica drained or scaled away (simply absent), the requests still waiting there
    #: for a first byte are given up and sent to another endpoint (``hung``).
    unhealthy: tuple[Unhealthy, ...] = ()
    #: Set when the control plane scales the model (it may be at zero): a request that finds no
    #: endpoint is then held for a replica to start (``app``), not refused. None: not autoscaled.
    autoscale: RouteAutoscale | None = None
    #: ``spec.access.projects``: the projects whose keys may use it; empty: every project.
    projects: frozenset[str] = frozenset()
    #: Its prices per 1M tokens (``spec.pricing``), for spend; None: free.
    prices: quota.Prices | None = None
    #: Whether it answers ``/v1/embeddings``; None: its spec does not say (the request goes to the engine).
    embeddings: bool | None = None
    #: For a LoRA adapter's route (``adapter_routes``): the served name of the model it runs on; "": a model.
    parent: str = ""
    #: For a LoRA adapter's route: how many adapters one engine of its base holds at once (0: not said).
    adapter_slots: int = 0
    #: ``kv_aware``: the version of its tokenizer files the control plane offers (``tokenizers``); "": none.
    tokenizer: str = ""

    def open_to(self, project: str) -> bool:
        """Whether a key of ``project`` may see and use the model (a request without a key may: no keys exist)."""
        return not self.projects or project in self.projects

    @property
    def cold(self) -> bool:
        """Autoscaled and without an endpoint: the next request waits for a replica to start."""
        return self.autoscale is not None and not self.endpoints

    def public_names(self) -> tuple[str, ...]:
        """The ids ``/v1/models`` lists for this model: served name first, then aliases."""
        return tuple(dict.fromkeys((self.served_name, *self.aliases)))


@dataclasses.dataclass(frozen=True, slots=True)
class RouteTable:
    """An immutable snapshot of every model's routes at one control-plane version."""

    version: int
    models: tuple[ModelRoute, ...]
    #: False only for the placeholder used before any table arrived: the router then
    #: answers 503 rather than claiming every model is unknown.
    loaded: bool = True
    #: The API keys of this version, so a request checks keys and routes from one snapshot.
    auth: Authenticator = dataclasses.field(default_factory=Authenticator)
    #: Per-model concurrency limits for admission: ``limits.concurrency`` in the document, capped
    #: by ``limits.concurrency_per_replica`` times the model's endpoints (see ``model_limits``).
    limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: The cluster CA's certificate (PEM) ``https://`` engines are verified with (``enginetls``); "": none.
    engine_ca: str = ""
    _by_name: Mapping[str, ModelRoute] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, ModelRoute] = {}
        for model in self.models:
            for key in (model.name, model.served_name):
                by_name.setdefault(key, model)
        for model in self.models:
            for alias in model.aliases:
                by_name.setdefault(alias, model)
        object.__setattr__(self, "_by_name", by_name)

    @classmethod
    def from_doc(cls, doc: routing.EndpointsDoc | Mapping[str, Any] | Any) -> RouteTable:
        """Build a table from the endpoints document (the object, or its JSON); ``TableError`` names a bad field."""
        try:
            endpoints = routing.EndpointsDoc.from_doc(doc)
        except routing.BadTable as e:
            raise TableError(str(e)) from None
        models = tuple(_route(f"models[{i}]", m) for i, m in enumerate(endpoints.models))
        models += tuple(a for i, m in enumerate(endpoints.models) for a in adapter_routes(models[i], m))
        limits = {m.name: m.concurrency for m in endpoints.models if m.concurrency}
        return cls(version=endpoints.version, models=models, auth=Authenticator.from_doc(endpoints.auth),
                   limits=model_limits(limits, models), engine_ca=endpoints.engine_ca)

    def lookup(self, name: str) -> ModelRoute | None:
        """The model a client's ``model`` field names, or None."""
        return self._by_name.get(name)

    def public_names(self) -> list[str]:
        """Every id a client may request, in table order, for listings and 404 messages."""
        return list(dict.fromkeys(n for m in self.models for n in m.public_names()))

    def endpoint_count(self) -> int:
        return sum(len(m.endpoints) for m in self.models)

    def unhealthy(self) -> dict[str, str]:
        """Every replica the document lists as not answering, with why."""
        return {u.replica_id: u.reason for m in self.models for u in m.unhealthy}


#: What the holder holds before the first table arrives.
NOT_LOADED = RouteTable(version=-1, models=(), loaded=False)


class TableHolder:
    """Holds the current table; ``swap`` replaces it in one assignment (no lock needed in asyncio)."""

    def __init__(self, table: RouteTable = NOT_LOADED) -> None:
        self.current = table
        self._listeners: list[Callable[[RouteTable], None]] = []

    def listen(self, fn: Callable[[RouteTable], None]) -> None:
        """Call ``fn`` with each table installed from now on (synchronously, inside ``swap``)."""
        self._listeners.append(fn)

    def swap(self, table: RouteTable) -> RouteTable:
        """Install ``table``, tell the listeners, and return the one it replaced."""
        old, self.current = self.current, table
        for fn in self._listeners:
            fn(table)
        return old


def model_limits(limits: Mapping[str, int], models: tuple[ModelRoute, ...]) -> dict[str, int]:
    """Admission's per-model limits: the model's own, and at most ``replica_limit`` per endpoint.

    Admitting no more than the endpoints can take together is what makes a request
    wait in the model's bounded queue (and get its 429 past the wait) when every
    replica is at its limit, rather than being sent to one that is full; the pick
    then skips the full ones (``upstream``). A model without endpoints gets no cap:
    a limit of 0 would hold its requests for the whole wait, when the answer is an
    immediate 503 saying why nothing is ready.
    """
    out = dict(limits)
    for model in models:
        if model.replica_limit and model.endpoints:
            cap = model.replica_limit * len(model.endpoints)
            out[model.name] = min(out.get(model.name, cap), cap)
    return out


def adapter_routes(base: ModelRoute, entry: routing.ModelEntry) -> tuple[ModelRoute, ...]:
    """One route per LoRA adapter of ``base``: its own model name, on the base's endpoints that hold it.

    The request's ``model`` stays the adapter's name (vLLM serves an adapter under its ``lora_name``), and
    everything counted per model (metering, admission, the router's metrics) counts it under that name.
    The endpoints whose engine holds it (has it registered: its agent fetched and loaded it) are used;
    which of them takes a request is the router's adapter affinity (``adaptercache``). While none does
    but others hold adapters (its agents are still fetching or loading it), it has no endpoint and is
    held as a cold start is (``cold``), so no request goes to an engine that would answer 404; when no
    endpoint says what it holds (a standby's table, which hears no agent), every endpoint of the base is
    used. Listed after every model, so a model's own name always wins over an adapter's (``lookup``).
    """
    reported = any(e.adapters for e in base.endpoints)
    out = []
    for name in entry.adapters:
        holders = tuple(e for e in base.endpoints if name in e.adapters)
        route = dataclasses.replace(base, name=name, served_name=name, aliases=(), parent=base.served_name,
                                    endpoints=holders or base.endpoints, adapter_slots=entry.adapter_slots)
        if reported and not holders:
            route = dataclasses.replace(
                route, endpoints=(), autoscale=base.autoscale or RouteAutoscale(len(base.endpoints),
                                                                                len(base.endpoints)),
                message=f"adapter {name} is not loaded into any replica of {base.served_name} yet (its agents "
                        f"are fetching or loading it; `llmgw describe model {base.name}` says why a load failed)")
        out.append(route)
    return tuple(out)


def _route(where: str, entry: routing.ModelEntry) -> ModelRoute:
    routing_name = entry.routing or pick.DEFAULT_ROUTING
    if routing_name not in pick.ROUTINGS:
        # Serving beats refusing the whole table over one field a newer control plane added.
        if routing_name not in _warned_routings:
            _warned_routings.add(routing_name)
            log.warning("%s.routing: unknown policy %r; using %s (known: %s)", where, routing_name,
                        pick.DEFAULT_ROUTING, ", ".join(pick.ROUTINGS))
        routing_name = pick.DEFAULT_ROUTING
    return ModelRoute(
        name=entry.name, served_name=entry.served_name or entry.name, aliases=entry.aliases, state=entry.state,
        message=entry.message, endpoints=entry.endpoints, created=entry.created, routing=routing_name,
        replica_limit=entry.concurrency_per_replica, engine=entry.engine, unhealthy=entry.unhealthy,
        autoscale=entry.autoscale, projects=frozenset(entry.projects), prices=entry.prices,
        embeddings=entry.embeddings, tokenizer=entry.tokenizer)
