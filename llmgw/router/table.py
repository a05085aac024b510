"""The route table: which engines serve which model, as the control plane last said.

A ``RouteTable`` is an immutable snapshot built from the control plane's
``GET /api/v1/endpoints`` document. The router never edits one: the watcher
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

from llmgw.core.errors import LlmgwError
from llmgw.router import pick
from llmgw.router.admission import limits_from_doc
from llmgw.router.auth import Authenticator

log = logging.getLogger(__name__)

#: Unknown ``routing`` values already warned about: the table arrives again on every
#: replica change, and a warning per table would bury the first one.
_warned_routings: set[str] = set()


class TableError(LlmgwError):
    """The endpoints document is not what the router understands; the message says where."""


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """One ready engine the router may send a model's requests to."""

    replica_id: str
    url: str  # scheme://host:port, no trailing slash
    api_key: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Unhealthy:
    """A replica out of routing because its engine stopped answering (``hung`` re-sends what waits there)."""

    replica_id: str
    reason: str = ""


#: ``spec.autoscale.cold_start_timeout``'s default, used when the document's is missing or malformed.
DEFAULT_COLD_START_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class RouteAutoscale:
    """What the router needs of a model's ``spec.autoscale``: its bounds, and how long to hold at zero."""

    min_replicas: int
    max_replicas: int
    #: How long a request for the model at zero is held for a replica to start, before a 503.
    cold_start_timeout_s: float = DEFAULT_COLD_START_TIMEOUT_S


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
    def from_doc(cls, doc: Any) -> RouteTable:
        """Build a table from the endpoints document; raise ``TableError`` naming the bad field."""
        if not isinstance(doc, Mapping):
            raise TableError(f"endpoints document: expected an object, got {type(doc).__name__}")
        version = doc.get("version")
        if not isinstance(version, int) or isinstance(version, bool):
            raise TableError(f"version: expected an integer, got {version!r}")
        raw_models = doc.get("models", [])
        if not isinstance(raw_models, list):
            raise TableError("models: expected a list")
        models = tuple(_model(f"models[{i}]", raw) for i, raw in enumerate(raw_models))
        return cls(version=version, models=models, auth=Authenticator.from_doc(doc.get("auth")),
                   limits=model_limits(limits_from_doc(doc), models))

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


def _replica_limit(where: str, raw: Mapping[str, Any]) -> int:
    # Tolerant, like limits_from_doc: a malformed limit must not make the router refuse
    # the whole table (and keep serving an old one); it is warned about and not applied.
    limits = raw.get("limits")
    n = limits.get("concurrency_per_replica") if isinstance(limits, Mapping) else None
    if n is None:
        return 0
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        log.warning("%s.limits.concurrency_per_replica: expected a whole number >= 0, got %r; no limit applied",
                    where, n)
        return 0
    return n


def _str(where: str, raw: Mapping[str, Any], key: str, *, default: str | None = None) -> str:
    value = raw.get(key)
    if value is None:  # a JSON null means "not set", as a missing key does
        value = default
    if not isinstance(value, str):
        raise TableError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def _model(where: str, raw: Any) -> ModelRoute:
    if not isinstance(raw, Mapping):
        raise TableError(f"{where}: expected an object")
    name = _str(where, raw, "name")
    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise TableError(f"{where}.aliases: expected a list of strings")
    raw_endpoints = raw.get("endpoints") or []
    if not isinstance(raw_endpoints, list):
        raise TableError(f"{where}.endpoints: expected a list")
    endpoints = []
    for i, ep in enumerate(raw_endpoints):
        ep_where = f"{where}.endpoints[{i}]"
        if not isinstance(ep, Mapping):
            raise TableError(f"{ep_where}: expected an object")
        # A trailing slash would make "url + path" ask the engine for "//v1/...", which
        # some engines answer with 404.
        url = _str(ep_where, ep, "url").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise TableError(f"{ep_where}.url: expected http:// or https://, got {url!r}")
        endpoints.append(Endpoint(replica_id=_str(ep_where, ep, "replica_id"), url=url,
                                  api_key=_str(ep_where, ep, "api_key", default="")))
    created = raw.get("created", 0)
    routing = raw.get("routing") or pick.DEFAULT_ROUTING
    unhealthy = _unhealthy(where, raw)
    if routing not in pick.ROUTINGS:
        # Serving beats refusing the whole table over one field a newer control plane added.
        if str(routing) not in _warned_routings:
            _warned_routings.add(str(routing))
            log.warning("%s.routing: unknown policy %r; using %s (known: %s)", where, routing,
                        pick.DEFAULT_ROUTING, ", ".join(pick.ROUTINGS))
        routing = pick.DEFAULT_ROUTING
    return ModelRoute(
        name=name,
        served_name=_str(where, raw, "served_name", default=name) or name,
        aliases=tuple(aliases),
        state=_str(where, raw, "state", default=""),
        message=_str(where, raw, "message", default=""),
        endpoints=tuple(endpoints),
        created=created if isinstance(created, int) and not isinstance(created, bool) else 0,
        routing=routing,
        replica_limit=_replica_limit(where, raw),
        engine=_str(where, raw, "engine", default=""),
        unhealthy=unhealthy,
        autoscale=_autoscale(where, raw),
    )


def _autoscale(where: str, raw: Mapping[str, Any]) -> RouteAutoscale | None:
    # Tolerant, like the limits: a control plane from before autoscaling sends none, and a malformed
    # one must not make the router refuse the whole table (and keep serving an old one). A bad timeout
    # is warned about and the default used: holding a request beats a 503 the model was meant to avoid.
    value = raw.get("autoscale")
    if value is None:
        return None
    if not isinstance(value, Mapping):
        log.warning("%s.autoscale: expected an object, got %r; the model is routed as not autoscaled", where, value)
        return None
    bounds = []
    for key in ("min_replicas", "max_replicas"):
        n = value.get(key, 0)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            log.warning("%s.autoscale.%s: expected a whole number >= 0, got %r; read as 0", where, key, n)
            n = 0
        bounds.append(n)
    timeout = value.get("cold_start_timeout_s", DEFAULT_COLD_START_TIMEOUT_S)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
        log.warning("%s.autoscale.cold_start_timeout_s: expected seconds > 0, got %r; holding requests %gs",
                    where, timeout, DEFAULT_COLD_START_TIMEOUT_S)
        timeout = DEFAULT_COLD_START_TIMEOUT_S
    return RouteAutoscale(min_replicas=bounds[0], max_replicas=bounds[1], cold_start_timeout_s=float(timeout))


def _unhealthy(where: str, raw: Mapping[str, Any]) -> tuple[Unhealthy, ...]:
    # Refused like endpoints when malformed: a router that misread it would either keep
    # requests waiting on a hung engine or re-send requests a drained one is finishing.
    items = raw.get("unhealthy")
    if items is None:  # a control plane from before liveness: nothing listed
        return ()
    if not isinstance(items, list):
        raise TableError(f"{where}.unhealthy: expected a list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TableError(f"{where}.unhealthy[{i}]: expected an object")
        out.append(Unhealthy(_str(f"{where}.unhealthy[{i}]", item, "replica_id"),
                             _str(f"{where}.unhealthy[{i}]", item, "reason", default="")))
    return tuple(out)
