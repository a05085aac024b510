"""Which engines each node should have installed: a pure function of the wants, the models and the node.

Three sources of wants, merged per node: an operator's wants scoped to the node
(``llmgw engine install node05 vllm 0.32.0``), wants scoped to the node's pool
(the node label ``pool``, as placement reads it), and, when the cluster setting
``models_trigger_installs`` allows, the ``engine``/``engine_version`` of each
model that could be placed on the node (its pool and selector match) and that
nothing on the node satisfies yet. The result is the node's whole ``Provision``;
the cluster sends it on Register and whenever it changes, and the agent installs
what it lists and keeps what it does not (a want dropped never uninstalls: only
``llmgw engine remove`` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from llmgw.control import events as ev
from llmgw.control.state import NodeView, ReplicaRecord
from llmgw.core.engines import version_matches
from llmgw.core.provision import EngineInstall, EngineWant, InstallState, Provision
from llmgw.core.specs import ModelSpec

NODE_SCOPE, POOL_SCOPE = "node:", "pool:"


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class ScopedWant:
    """An operator's want: an engine version on one node ("node:<id>") or on every node of a pool ("pool:<name>")."""

    scope: str
    engine: str
    version: str
    created_at: float = dataclasses.field(default=0.0, compare=False)

    @property
    def want(self) -> EngineWant:
        return EngineWant(self.engine, self.version)

    def applies_to(self, node: NodeView) -> bool:
        if self.scope.startswith(NODE_SCOPE):
            return self.scope[len(NODE_SCOPE):] == node.id
        if self.scope.startswith(POOL_SCOPE):
            return node.labels.get("pool") == self.scope[len(POOL_SCOPE):]
        return False


def scope_of(*, node: str = "", pool: str = "") -> str:
    return f"{NODE_SCOPE}{node}" if node else f"{POOL_SCOPE}{pool}"


@dataclasses.dataclass(frozen=True, slots=True)
class EngineSettings:
    """The cluster's engine settings (the ``settings`` table; ``llmgw server`` flags override them)."""

    #: A pip simple index URL, or with ``find_links`` a wheelhouse page; "" is none (installs then fail saying so).
    index_url: str = ""
    find_links: bool = False
    #: Whether a model's engine_version may make a node install that engine.
    models_trigger_installs: bool = True
    #: Whether agents running as root may install the OS packages a variant needs.
    os_packages: bool = False

    KEYS = ("engine_index_url", "engine_find_links", "models_trigger_installs", "engine_os_packages")

    @classmethod
    def from_map(cls, values: Mapping[str, str]) -> EngineSettings:
        def flag(key: str, default: bool) -> bool:
            return values[key] == "true" if key in values else default
        return cls(index_url=values.get("engine_index_url", ""), find_links=flag("engine_find_links", False),
                   models_trigger_installs=flag("models_trigger_installs", True),
                   os_packages=flag("engine_os_packages", False))

    def to_map(self) -> dict[str, str]:
        def text(b: bool) -> str:
            return "true" if b else "false"
        return {"engine_index_url": self.index_url, "engine_find_links": text(self.find_links),
                "models_trigger_installs": text(self.models_trigger_installs),
                "engine_os_packages": text(self.os_packages)}


def _may_run_on(spec: ModelSpec, node: NodeView) -> bool:
    """The model's pool and selector take the node (the static checks placement reads from labels)."""
    if spec.pool and node.labels.get("pool") != spec.pool:
        return False
    return all(node.labels.get(k) == v for k, v in spec.node_selector)


def _satisfied(node: NodeView, want: EngineWant) -> bool:
    """The node runs ``want`` already: a Ready install, or an engine its agent reports (its config names it)."""
    if any(i.state is InstallState.Ready and i.engine == want.engine and version_matches(i.version, want.version)
           for i in node.inventory.installs):
        return True
    return any(name == want.engine and version_matches(v, want.version) for name, v in node.inventory.engines)


def model_wants(node: NodeView, models: Mapping[str, ModelSpec]) -> list[EngineWant]:
    """What models that could be placed here need and nothing here satisfies (a model without engine_version: none)."""
    out = []
    for spec in models.values():
        if not spec.engine_version or not _may_run_on(spec, node):
            continue
        want = EngineWant(spec.engine, spec.engine_version)
        # An install under way or failed does not satisfy it, so the want stays until it is Ready;
        # then it goes, and the agent keeps the install (a Provision lists wants, never removals).
        if not _satisfied(node, want):
            out.append(want)
    return out


def provision_for(node: NodeView, wants: Iterable[ScopedWant], models: Mapping[str, ModelSpec],
                  settings: EngineSettings) -> Provision:
    """The node's whole Provision: its own and its pool's wants, plus the models' when the setting allows."""
    chosen = {w.want for w in wants if w.applies_to(node)}
    if settings.models_trigger_installs:
        chosen.update(model_wants(node, models))
    return Provision(wants=tuple(sorted(chosen)), index_url=settings.index_url, find_links=settings.find_links,
                     os_packages=settings.os_packages)


def provisions(nodes: Iterable[NodeView], wants: Iterable[ScopedWant], models: Mapping[str, ModelSpec],
               settings: EngineSettings) -> dict[str, Provision]:
    """``provision_for`` each node, with the wants indexed by scope and only models that pin a version looked at.

    Measured (bench/provision_pass.py), 10,000 nodes in 10 pools and 100 models, in the pass run every second:
    ``provision_for`` per node took 36 ms with no model pinning a version and 244 ms with all 100 pinning one;
    this takes 7 ms and 60 ms.
    """
    by_scope: dict[str, set[EngineWant]] = {}
    for w in wants:
        by_scope.setdefault(w.scope, set()).add(w.want)
    # By pool: a model pinned to pool P is looked at only for P's nodes.
    pinned: dict[str, dict[str, ModelSpec]] = {}
    if settings.models_trigger_installs:
        for n, s in models.items():
            if s.engine_version:
                pinned.setdefault(s.pool, {})[n] = s
    empty = Provision(index_url=settings.index_url, find_links=settings.find_links,
                      os_packages=settings.os_packages)
    out = {}
    seen: dict[tuple[object, ...], frozenset[EngineWant]] = {}
    for node in nodes:
        chosen = by_scope.get(NODE_SCOPE + node.id, set()) | by_scope.get(POOL_SCOPE + node.labels.get("pool", ""),
                                                                          set())
        pool = node.labels.get("pool", "")
        groups = [g for g in (pinned.get(""), pinned.get(pool) if pool else None) if g]
        if groups:
            # Nodes alike in labels and in what they run want alike: worked out once per kind of node.
            key = (tuple(sorted(node.labels.items())), node.inventory.engines, node.inventory.installs)
            implied = seen.get(key)
            if implied is None:
                implied = seen[key] = frozenset(w for g in groups for w in model_wants(node, g))
            chosen = chosen | implied
        out[node.id] = dataclasses.replace(empty, wants=tuple(sorted(chosen))) if chosen else empty
    return out


def users_of(want: EngineWant, node_ids: Iterable[str], replicas: Iterable[ReplicaRecord],
             models: Mapping[str, ModelSpec]) -> list[str]:
    """Replicas on ``node_ids`` whose model runs ``want``'s engine at a version it may be (ids, sorted).

    A model that names no engine_version may be running any version, so it counts: a removal is
    refused rather than pulled from under a replica.
    """
    on = set(node_ids)
    out = []
    for r in replicas:
        spec = models.get(r.model)
        if spec is None or spec.engine != want.engine:
            continue
        if not ({r.node_id, *(m.node_id for m in r.members)} & on):
            continue
        if version_matches(want.version, spec.engine_version):  # "" (any version) matches too
            out.append(r.id)
    return sorted(out)


def install_events(node_id: str, before: Iterable[EngineInstall], after: Iterable[EngineInstall], *,
                   now: float) -> list[ev.Event]:
    """An event for each install that came to rest in a new state (Ready, Failed, Unsupported) on a heartbeat.

    Installing's progress is not one: it changes every few seconds, and the node's installs show it.
    """
    was = {i.want: i.state for i in before}
    out = []
    for i in after:
        if i.state is InstallState.Installing or was.get(i.want) is i.state:
            continue
        kind = ev.NORMAL if i.state is InstallState.Ready else ev.WARNING
        out.append(ev.Event(now, kind, f"EngineInstall{i.state.value}", f"node/{node_id}", i.sentence(node_id),
                            node=node_id))
    return out
