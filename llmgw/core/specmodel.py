"""The model spec: ``Model`` and its ``ModelSpec``, their fingerprint and their canonical document."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from llmgw.core import adapters as adapters_mod
from llmgw.core import autoscale as autoscale_mod
from llmgw.core import idle as idle_mod
from llmgw.core import kvdigest, quota
from llmgw.core.specplace import Gpus, Resources, resources_doc
from llmgw.core.specscale import Rollout, autoscale_doc, count_doc, idle_doc

API_VERSION = "llmgw/v1"
DEFAULT_STARTUP_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    engine: str
    served_name: str
    source: str = ""
    replicas: int = 1
    resources: Resources = Resources()
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    engine_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    #: Other names clients may use for this model; the router rewrites them to served_name.
    aliases: tuple[str, ...] = ()
    #: The router's policy for this model: one of ROUTING_POLICIES.
    routing: str = "prefix_cache"
    #: Requests one router sends one replica at a time (0: no limit); the rest wait in the
    #: router's admission queue. Router-side only, so not in the fingerprint.
    max_concurrency_per_replica: int = 0
    #: How a change to the engine is rolled out over the replicas.
    rollout: Rollout = Rollout()
    #: "" for any installed version; else the exact version or a prefix ending at a dot.
    engine_version: str = ""
    #: Node labels a node must carry, as sorted (label, value) pairs.
    node_selector: tuple[tuple[str, str], ...] = ()
    #: The node label ``pool`` a node must carry; "" for any node.
    pool: str = ""
    #: One of PLACEMENT_POLICIES.
    placement: str = "spread"
    #: Higher is placed first within a reconcile pass.
    priority: int = 0
    #: The dtype the engine runs the weights in, one of DTYPES but "auto" ("": the engine's choice).
    dtype: str = ""
    #: Tokens of context to serve; 0: the engine's default. Passed as the engine's own flag.
    context_length: int = 0
    #: The one file of a remote source the engine needs (an hf repo's .gguf); "": what the source names.
    source_file: str = ""
    #: The expected sha256 of a remote file (64 lower-case hex); "": checked by size alone.
    source_sha256: str = ""
    #: Bounds, targets and windows of the autoscaler; None: ``replicas`` is set by hand. With it,
    #: ``replicas`` is min_replicas, only a floor: the count in force is the autoscaler's.
    autoscale: autoscale_mod.Autoscale | None = None
    #: ``access.projects``: the projects whose keys may use the model; (): every project. Router-side only.
    projects: tuple[str, ...] = ()
    #: ``pricing``: per 1M tokens, turning usage into spend; None: not priced. Router-side only.
    prices: quota.Prices | None = None
    #: ``spec.adapters``: LoRA adapters loaded into the running engines (``core.adapters``). Not in the
    #: fingerprint: adding or removing one loads or unloads it at runtime; only the limits they need are.
    adapters: tuple[adapters_mod.Adapter, ...] = ()
    #: ``spec.idle``: after how long without a request a replica sleeps (or stops); None: never.
    idle: idle_mod.Idle | None = None

    def fingerprint(self) -> str:
        """A short hash of everything that changes the engine process (not replicas, aliases, routing or rollout)."""
        doc = dataclasses.asdict(self)
        # autoscale only moves the count: changing a target or a window must never restart an engine.
        for key in ("replicas", "aliases", "routing", "rollout", "max_concurrency_per_replica", "autoscale",
                    "projects", "prices", "adapters"):
            doc.pop(key)
        limits = adapters_mod.lora_limits(self.adapters)
        if limits is not None:  # what the engine is started with: a bigger rank than it allows rolls it
            doc["lora"] = dataclasses.asdict(limits)
        if self.adapters and self.engine in adapters_mod.AT_START:  # llama.cpp's --lora files: a change restarts
            doc["lora_files"] = [a.to_doc() for a in self.adapters]
        # idle only says when the control plane sleeps or stops a replica: no restart when it changes, but for
        # the flag a sleeping engine must be started with (vLLM's --enable-sleep-mode), and likewise kv_aware's
        # event publisher: without a restart they would reach only replicas started later (issue 31).
        doc.pop("idle")
        if self.idle is not None and self.idle.action == "sleep" and self.engine in idle_mod.SLEEPERS:
            doc["sleep_mode"] = True
        if self.routing == "kv_aware" and self.engine in kvdigest.PUBLISHERS:
            doc["kv_events"] = True
        # placement and priority only order future decisions: rolling every
        # replica because a tie-break changed would restart engines for nothing.
        # node_selector and pool stay in: changing them is how an operator moves
        # a model, and only a new fingerprint makes the rollout replace replicas
        # (new ones first) on nodes that match.
        for key in ("placement", "priority"):
            doc.pop(key)
        # Fields added after the first release hash only when set, so a model
        # that uses none of them keeps its fingerprint across an upgrade:
        # otherwise upgrading the control plane would restart every engine.
        for key, unset in (("engine_version", ""), ("node_selector", ()), ("pool", ""), ("dtype", ""),
                           ("context_length", 0), ("source_file", ""), ("source_sha256", "")):
            if doc[key] == unset:
                doc.pop(key)
        if self.resources.gpus == Gpus():
            doc["resources"].pop("gpus")
        if self.resources.nnodes == 1:
            doc["resources"].pop("nnodes")
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True, slots=True)
class Model:
    name: str
    spec: ModelSpec
    #: ``metadata.labels``, sorted: for people and ``llmgw get models -l``; not in the spec's fingerprint (a
    #: label changed restarts nothing).
    labels: tuple[tuple[str, str], ...] = ()

    def to_manifest(self) -> dict[str, Any]:
        """The canonical document for this model; ``parse_manifest`` reads it back unchanged."""
        s = self.spec
        spec: dict[str, Any] = {
            "engine": s.engine,
            "served_name": s.served_name,
            "source": s.source,
            "replicas": s.replicas,
            "resources": resources_doc(s.resources),
            "startup_timeout": s.startup_timeout_s,
            "engine_args": list(s.engine_args),
            "env": dict(s.env),
            "aliases": list(s.aliases),
            "routing": s.routing,
            "max_concurrency_per_replica": s.max_concurrency_per_replica,
            "rollout": {"max_surge": count_doc(s.rollout.max_surge),
                        "max_unavailable": count_doc(s.rollout.max_unavailable)},
            "engine_version": s.engine_version,
            "node_selector": dict(s.node_selector),
            "pool": s.pool,
            "placement": s.placement,
            "priority": s.priority,
        }
        if s.dtype:
            spec["dtype"] = s.dtype
        if s.context_length:
            spec["context_length"] = s.context_length
        if s.source_file:
            spec["source_file"] = s.source_file
        if s.source_sha256:
            spec["source_sha256"] = s.source_sha256
        if s.autoscale is not None:
            # replicas is the autoscaler's to set: written back, it would be refused as a manual count.
            del spec["replicas"]
            spec["autoscale"] = autoscale_doc(s.autoscale)
        if s.adapters:
            spec["adapters"] = [a.to_doc() for a in s.adapters]
        if s.projects:
            spec["access"] = {"projects": list(s.projects)}
        if s.prices is not None:
            spec["pricing"] = s.prices.to_doc()
        if s.idle is not None:
            spec["idle"] = idle_doc(s.idle)
        meta: dict[str, Any] = {"name": self.name}
        if self.labels:
            meta["labels"] = dict(self.labels)
        return {"apiVersion": API_VERSION, "kind": "Model", "metadata": meta, "spec": spec}
