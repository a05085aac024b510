"""The table publisher: the routers' endpoints table, built from the store after every pass, versioned,
and handed out through a long poll (``wait``) that answers as soon as it changes.

A standby publishes it too (from the store alone), so a router that watches any control plane keeps
routing. The document is ``llmgw.api.routing.EndpointsDoc``, built in one place (``build_endpoints_doc``);
the in-process router reads the object, a standalone one its ``to_doc()`` over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from llmgw.api import routemodels, routing
from llmgw.control import tokenizerfiles
from llmgw.control.loop import sleeper
from llmgw.control.loop.autoscaling import in_force
from llmgw.control.loop.context import LoopContext
from llmgw.control.state import Phase, ReplicaRecord
from llmgw.control.status import summarize
from llmgw.control.store import queueing
from llmgw.control.store import settings as cluster_settings
from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Store
from llmgw.core import adapters, engines, quota, specs

log = logging.getLogger(__name__)


#: The LoRA adapters each replica's engine holds now, by replica id (agents' ``ShardStatus.adapters``).
Held = Mapping[str, tuple[str, ...]]


def _model_route(spec: specs.ModelSpec, name: str, in_force_spec: specs.ModelSpec, mine: list[ReplicaRecord],
                 now: float, held: Held, sleeping: Mapping[str, int] | None = None) -> routing.ModelEntry:
    st = summarize(in_force_spec, mine, now=now)
    auto = spec.autoscale
    asleep = sleeping or {}
    hint = None if auto is None else routing.AutoscaleHint(auto.min_replicas, auto.max_replicas,
                                                           auto.cold_start_timeout_s)
    if hint is None and spec.idle is not None:
        # spec.idle (issue 31): with every replica asleep the router holds a request as for a model at zero,
        # and its report wakes one (``loop/sleeper``); the bounds are the count set by hand.
        hint = routing.AutoscaleHint(spec.replicas, spec.replicas, routemodels.DEFAULT_COLD_START_TIMEOUT_S)
    return routing.ModelEntry(
        name=name, served_name=spec.served_name, aliases=tuple(spec.aliases), routing=spec.routing,
        engine=spec.engine,
        # Read by the router's admission; 0 is no limit.
        concurrency_per_replica=spec.max_concurrency_per_replica,
        state=st.state, message=st.message,
        endpoints=tuple(routing.EndpointDoc(r.id, r.endpoint, r.api_key, node=r.node_id or "",
                                            adapters=held.get(r.id, ()) if spec.adapters else ())
                        for r in mine if r.phase is Phase.READY and r.endpoint and r.id not in asleep),
        # Replicas out of routing because their engine stopped answering (``router.hung``): a router gives
        # up the requests still waiting for their first byte there and sends them to another replica.
        # Listed apart, because a replica that leaves ``endpoints`` to be drained must keep its requests.
        unhealthy=tuple(routing.UnhealthyDoc(r.id, r.message) for r in mine if r.phase is Phase.UNHEALTHY),
        # A model at zero with this is held by the router, not refused.
        autoscale=hint,
        # Issue 26: keys of other projects get 404 for it; its prices turn usage into spend.
        projects=spec.projects, prices=spec.prices,
        # /v1/models says it, and the router refuses /v1/embeddings itself for a model that does not.
        embeddings=engines.embeds(spec.engine, spec.engine_args),
        # Each its own model name, routed to the endpoints above that hold it (``router.table``).
        adapters=tuple(a.name for a in spec.adapters),
        # How many one engine holds at once: the router's model of each engine's cache (``router.adaptercache``).
        adapter_slots=limits.max_cpu_loras if (limits := adapters.lora_limits(spec.adapters)) else 0,
        # kv_aware: the version of the tokenizer files routers fetch to tokenize text prompts ("": none offered).
        tokenizer=tokenizerfiles.version_of(spec),
    )


def build_endpoints_doc(store: Store, now: float, *, engine_ca: str = "", held: Held | None = None
                        ) -> routing.EndpointsDoc:
    """The routers' table as the store holds it now: each model's routes, and the API keys (version 0).

    ``engine_ca``: the cluster CA's certificate (PEM, public), which routers verify ``https://`` engines with.
    """
    by_model: dict[str, list[ReplicaRecord]] = {}
    for r in store.list_replicas():
        by_model.setdefault(r.model, []).append(r)
    states = store.autoscale_states()
    sleeping = sleeper.sleeping_from(store.settings())
    models = []
    for stored in store.list_models():
        m = stored.model
        models.append(_model_route(m.spec, m.name, in_force({m.name: m.spec}, states)[m.name],
                                   by_model.get(m.name, []), now, held or {}, sleeping))
    stored_keys = store.list_keys()
    assigned = queueing.read(store)  # classes and weights (issue 32)
    none = queueing.Assigned()
    keys = tuple(routing.KeyEntry(k.id, k.sha256, tuple(k.models), k.rpm, k.tpm, k.priority, project=k.project,
                                  user=k.user, limits=k.limits, **assigned.keys.get(k.id, none).to_doc())
                 for k in stored_keys if not k.disabled)
    # Only projects with budgets, a class or a weight: the rest need nothing from a router but their name, which
    # each key carries.
    limited = store.project_limits()
    projects = tuple(routing.ProjectEntry(name, limited.get(name, quota.Limits()),
                                          **assigned.projects.get(name, none).to_doc())
                     for name in sorted(limited.keys() | assigned.projects.keys()))
    classes = tuple(cluster_settings.read(store).priority_classes)
    # Required only once a key exists, so a fresh `make up` keeps answering without one. A disabled
    # key counts: with every key disabled everyone is refused, where following the enabled keys
    # opened the API to anyone the moment the last one was disabled.
    return routing.EndpointsDoc(models=tuple(models), auth=routing.AuthDoc(required=bool(stored_keys), keys=keys,
                                                                                    projects=projects,
                                                                                    priority_classes=classes),
                                engine_ca=engine_ca)


class TablePublisher:
    def __init__(self, ctx: LoopContext, *, engine_ca: str = "", held: Callable[[], Held] = dict) -> None:
        self._ctx = ctx
        #: The adapters each replica's engine holds, as its agent last said (a standby knows none: the
        #: router then sends an adapter's requests to any ready endpoint of its model).
        self._held = held
        self._engine_ca = engine_ca  # the cluster CA's certificate, published with every table
        self._changed = asyncio.Condition()
        self.table = routing.EndpointsDoc()
        self._published = False  # the first build is published (version 1) even when it routes nothing
        self._closing = False

    def doc(self, held: Held | None = None) -> routing.EndpointsDoc:
        """The document as the store holds it now (without its version); reads the store where it is called.

        ``held``: the adapters each replica holds, taken on the loop (the agents' reports are the loop's).
        """
        held = self._held() if held is None else held
        return build_endpoints_doc(self._ctx.store, self._ctx.clock(), engine_ca=self._engine_ca, held=held)

    async def publish(self) -> None:
        """Builds the table and, when anything but its version changed, publishes it under the next version."""
        # Built where the store is read: it is store rows and a summary of each model, nothing of the loop's.
        doc = await self._ctx.call(self.doc, self._held())
        # Everything but the version is compared: a key created or deleted must reach the router too.
        if not self._published or not doc.same_routes(self.table):
            async with self._changed:
                self.table = doc.with_version(self.table.version + 1)
                self._published = True
                self._changed.notify_all()

    async def update(self) -> None:
        """``publish``, as a pass's step: a database that does not answer leaves routers the last table."""
        try:
            await self.publish()
        except Exception as e:
            # Routers keep the last table; before, this ended the loop and with it the server, on a
            # database restart (seen with PostgreSQL stopped for one second).
            if not (why := store_mod.unreachable(e)):
                raise
            log.warning("the router's table was not refreshed: the database did not answer (%s)", why)

    async def wait(self, *, after: int | None, timeout: float) -> routing.EndpointsDoc:
        """The table; when ``after`` is its current version, waits up to ``timeout`` for a change."""
        if after is None or after != self.table.version:
            return self.table
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(
                    lambda: self._closing or self.table.version != after), timeout)
            except TimeoutError:
                pass
        return self.table

    async def close(self) -> None:
        """Answers every waiting long poll now, so a shutdown does not wait out their timeouts."""
        async with self._changed:
            self._closing = True
            self._changed.notify_all()
