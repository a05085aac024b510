"""One model of the route table (``routing.EndpointsDoc``): its entry documents, and reading one as a router does.

``ModelEntry`` holds a model's names, ready endpoints (``EndpointDoc``), unhealthy replicas
(``UnhealthyDoc``), limits and autoscale bounds (``AutoscaleHint``). ``read_model`` reads one from the
table's JSON: strict where routing depends on it (a name, an endpoint's URL, the unhealthy list, the
projects allowed: ``BadTable`` naming the field), tolerant elsewhere (a malformed limit, bound or price
is warned about and left out, so a newer control plane never makes a router refuse the whole table).

Standard library and ``llmgw.core`` only, like ``routing``, which re-exports every name here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from llmgw.api.reports import WireError
from llmgw.core import quota

log = logging.getLogger(__name__)

#: ``spec.autoscale.cold_start_timeout``'s default, used when the document's is missing or malformed.
DEFAULT_COLD_START_TIMEOUT_S = 60.0


class BadTable(WireError):
    """An endpoints document a router cannot route from; the message names the field."""


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointDoc:
    """One ready engine of a model."""

    replica_id: str
    url: str  # scheme://host:port, no trailing slash once read
    api_key: str = ""
    node: str = ""  # the node it runs on (issue 26: usage is metered per node); "": unknown
    #: The LoRA adapters its engine holds now, by name (its agent's ``ShardStatus.adapters``).
    adapters: tuple[str, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"replica_id": self.replica_id, "url": self.url, "api_key": self.api_key}
        if self.node:
            doc["node"] = self.node
        if self.adapters:
            doc["adapters"] = list(self.adapters)
        return doc


@dataclasses.dataclass(frozen=True, slots=True)
class UnhealthyDoc:
    """A replica out of routing because its engine stopped answering; its waiting requests go elsewhere."""

    replica_id: str
    reason: str = ""

    def to_doc(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "reason": self.reason}


@dataclasses.dataclass(frozen=True, slots=True)
class AutoscaleHint:
    """A model's ``spec.autoscale`` as routers need it: its bounds, and how long to hold a request at zero."""

    min_replicas: int
    max_replicas: int
    cold_start_timeout_s: float = DEFAULT_COLD_START_TIMEOUT_S

    def to_doc(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "cold_start_timeout_s": self.cold_start_timeout_s}


@dataclasses.dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model of the table, as the control plane says it (the router applies its own defaults)."""

    name: str
    served_name: str = ""  # "": the name
    aliases: tuple[str, ...] = ()
    routing: str = ""  # a policy name; "" or one the router does not know: its default
    engine: str = ""
    #: ``limits.concurrency_per_replica``: requests one router sends one endpoint at a time; 0: no limit.
    concurrency_per_replica: int = 0
    #: ``limits.concurrency``: requests one router lets in for the model at once; 0: no limit.
    concurrency: int = 0
    state: str = ""
    message: str = ""
    endpoints: tuple[EndpointDoc, ...] = ()
    unhealthy: tuple[UnhealthyDoc, ...] = ()
    autoscale: AutoscaleHint | None = None  # None: not autoscaled
    created: int = 0
    #: ``spec.access.projects``: the projects whose keys may use the model; empty: every project.
    projects: tuple[str, ...] = ()
    #: ``spec.pricing`` per 1M tokens (input, cached input, output); None: free.
    prices: quota.Prices | None = None
    #: Whether it answers ``/v1/embeddings`` (``core.engines.embeds``); None: its spec does not say.
    embeddings: bool | None = None
    #: ``spec.adapters``' names: each a model name of its own, served by this model's endpoints that hold it.
    adapters: tuple[str, ...] = ()
    #: How many adapters one of its engines holds at once (``--max-cpu-loras``), least recently used
    #: evicted (``core.adapteraffinity``); 0: not said (an older control plane).
    adapter_slots: int = 0
    #: ``kv_aware``: the version of the model's tokenizer files a router may fetch (``router.tokenizers``); "": none.
    tokenizer: str = ""

    def to_doc(self) -> dict[str, Any]:
        limits: dict[str, int] = {"concurrency_per_replica": self.concurrency_per_replica}
        if self.concurrency:
            limits["concurrency"] = self.concurrency
        doc: dict[str, Any] = {
            "name": self.name, "served_name": self.served_name, "aliases": list(self.aliases),
            "routing": self.routing, "engine": self.engine, "limits": limits,
            "state": self.state, "message": self.message,
            "endpoints": [e.to_doc() for e in self.endpoints],
            "unhealthy": [u.to_doc() for u in self.unhealthy],
        }
        if self.autoscale is not None:
            doc["autoscale"] = self.autoscale.to_doc()
        if self.created:
            doc["created"] = self.created
        if self.projects:
            doc["projects"] = list(self.projects)
        if self.prices is not None:
            doc["pricing"] = self.prices.to_doc()
        if self.embeddings is not None:
            doc["embeddings"] = self.embeddings
        if self.adapters:
            doc["adapters"] = list(self.adapters)
        if self.adapter_slots:
            doc["adapter_slots"] = self.adapter_slots
        if self.tokenizer:
            doc["tokenizer"] = self.tokenizer
        return doc


# -- reading a document, as a router: strict where routing depends on it, tolerant elsewhere ---------------
def is_int(value: Any) -> bool:
    """A JSON integer (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _str(where: str, raw: Mapping[str, Any], key: str, *, default: str | None = None) -> str:
    value = raw.get(key)
    if value is None:  # a JSON null means "not set", as a missing key does
        value = default
    if not isinstance(value, str):
        raise BadTable(f"{where}.{key}: expected a string, got {value!r}")
    return value


def read_model(where: str, raw: Any) -> ModelEntry:
    """``raw`` (the table's ``models[i]``, ``where`` in refusals) as a ``ModelEntry``; ``BadTable`` if unroutable."""
    if not isinstance(raw, Mapping):
        raise BadTable(f"{where}: expected an object")
    name = _str(where, raw, "name")
    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise BadTable(f"{where}.aliases: expected a list of strings")
    endpoints = _endpoints(where, raw)  # checked in the order a router always checked them
    unhealthy = _unhealthy(where, raw)
    created = raw.get("created", 0)
    routing = raw.get("routing")
    limits = raw.get("limits")
    limits = limits if isinstance(limits, Mapping) else {}
    concurrency = limits.get("concurrency")
    embeddings = raw.get("embeddings")
    slots = raw.get("adapter_slots")
    return ModelEntry(
        name=name, served_name=_str(where, raw, "served_name", default=name), aliases=tuple(aliases),
        # Not checked against the policies here (the router knows them): an unknown one is its to warn about.
        routing="" if routing is None else routing if isinstance(routing, str) else str(routing),
        engine=_str(where, raw, "engine", default=""),
        concurrency_per_replica=_per_replica(where, limits),
        concurrency=concurrency if is_int(concurrency) and concurrency > 0 else 0,
        state=_str(where, raw, "state", default=""), message=_str(where, raw, "message", default=""),
        endpoints=endpoints, unhealthy=unhealthy, autoscale=_autoscale(where, raw),
        created=created if is_int(created) else 0, projects=_projects_allowed(where, raw),
        prices=_prices(where, raw), embeddings=embeddings if isinstance(embeddings, bool) else None,
        adapters=_names(f"{where}.adapters", raw.get("adapters")),
        adapter_slots=slots if is_int(slots) and slots > 0 else 0,
        tokenizer=tokenizer if isinstance(tokenizer := raw.get("tokenizer"), str) else "")


def _names(where: str, value: Any) -> tuple[str, ...]:
    """A list of adapter names, tolerantly: a malformed one is warned about and read as none."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        log.warning("%s: expected a list of names, got %r; read as none", where, value)
        return ()
    return tuple(value)


def _projects_allowed(where: str, raw: Mapping[str, Any]) -> tuple[str, ...]:
    # Strict: read wrongly, a model restricted to one project would be open to every project.
    value = raw.get("projects")
    if value is None:
        return ()
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p for p in value):
        raise BadTable(f"{where}.projects: expected a non-empty list of project names")
    return tuple(value)


def _prices(where: str, raw: Mapping[str, Any]) -> quota.Prices | None:
    value = raw.get("pricing")
    if value is None:
        return None
    try:
        return quota.Prices.from_doc(value)
    except (quota.BadLimits, TypeError) as exc:
        log.warning("%s.pricing: %s; the model is metered without a price", where, exc)
        return None


def _endpoints(where: str, raw: Mapping[str, Any]) -> tuple[EndpointDoc, ...]:
    items = raw.get("endpoints") or []
    if not isinstance(items, list):
        raise BadTable(f"{where}.endpoints: expected a list")
    out = []
    for i, ep in enumerate(items):
        ep_where = f"{where}.endpoints[{i}]"
        if not isinstance(ep, Mapping):
            raise BadTable(f"{ep_where}: expected an object")
        # A trailing slash would make "url + path" ask the engine for "//v1/...", which
        # some engines answer with 404.
        url = _str(ep_where, ep, "url").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise BadTable(f"{ep_where}.url: expected http:// or https://, got {url!r}")
        node = ep.get("node")
        out.append(EndpointDoc(replica_id=_str(ep_where, ep, "replica_id"), url=url,
                               api_key=_str(ep_where, ep, "api_key", default=""),
                               node=node if isinstance(node, str) else "",
                               adapters=_names(f"{ep_where}.adapters", ep.get("adapters"))))
    return tuple(out)


def _unhealthy(where: str, raw: Mapping[str, Any]) -> tuple[UnhealthyDoc, ...]:
    # Refused like endpoints when malformed: a router that misread it would either keep
    # requests waiting on a hung engine or re-send requests a drained one is finishing.
    items = raw.get("unhealthy")
    if items is None:  # a control plane from before liveness: nothing listed
        return ()
    if not isinstance(items, list):
        raise BadTable(f"{where}.unhealthy: expected a list")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise BadTable(f"{where}.unhealthy[{i}]: expected an object")
        out.append(UnhealthyDoc(_str(f"{where}.unhealthy[{i}]", item, "replica_id"),
                                _str(f"{where}.unhealthy[{i}]", item, "reason", default="")))
    return tuple(out)


def _per_replica(where: str, limits: Mapping[str, Any]) -> int:
    # Tolerant, like limits.concurrency: a malformed limit must not make the router refuse
    # the whole table (and keep serving an old one); it is warned about and not applied.
    n = limits.get("concurrency_per_replica")
    if n is None:
        return 0
    if not is_int(n) or n < 0:
        log.warning("%s.limits.concurrency_per_replica: expected a whole number >= 0, got %r; no limit applied",
                    where, n)
        return 0
    return int(n)


def _autoscale(where: str, raw: Mapping[str, Any]) -> AutoscaleHint | None:
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
        if not is_int(n) or n < 0:
            log.warning("%s.autoscale.%s: expected a whole number >= 0, got %r; read as 0", where, key, n)
            n = 0
        bounds.append(n)
    timeout = value.get("cold_start_timeout_s", DEFAULT_COLD_START_TIMEOUT_S)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
        log.warning("%s.autoscale.cold_start_timeout_s: expected seconds > 0, got %r; holding requests %gs",
                    where, timeout, DEFAULT_COLD_START_TIMEOUT_S)
        timeout = DEFAULT_COLD_START_TIMEOUT_S
    return AutoscaleHint(min_replicas=bounds[0], max_replicas=bounds[1], cold_start_timeout_s=float(timeout))
