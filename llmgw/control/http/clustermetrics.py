"""The cluster as Prometheus series: nodes and their GPUs, replicas by model and phase, leadership, certificates.

What the control plane already holds, read at each scrape (no history kept here, no work between scrapes):

- ``llmgw_node_up{node}``: 1 while the node's agent is connected to this (leading) control plane, else 0;
  ``llmgw_node_memory_total_bytes`` / ``llmgw_node_memory_available_bytes``: its last heartbeat's;
- ``llmgw_gpu_memory_total_bytes`` / ``llmgw_gpu_memory_used_bytes{node,gpu}``: each GPU's, from the heartbeats;
  ``llmgw_gpu_utilization_ratio{node,gpu}``: how busy it was (0..1), only for a GPU whose agent reports it;
- ``llmgw_model_replicas{model,phase}``: replicas by model and phase (every phase, 0 included);
  ``llmgw_replica_failures{model,replica}``: a replica's failed starts in a row (a crash loop climbs);
- ``llmgw_leader`` (1: this control plane leads) and ``llmgw_leader_term`` (the lease's term: it moves at each
  change of leader, so ``changes(max(llmgw_leader_term)[1h])`` counts the changes);
- ``llmgw_certificate_expiry_timestamp_seconds{certificate,node}``: when each certificate stops being valid
  (unix seconds): the cluster CA (``ca``), the API's (``api``), the agents' gRPC server's (``server``), and each
  node's newest unrevoked client certificate (``node``, with its node).

Only the leader knows the nodes (a standby's lists are empty), so a query takes ``max`` over control planes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from prometheus_client import metrics_core
from prometheus_client.registry import Collector

from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.store.store import StoredNodeCert
from llmgw.core import pki


class _Cluster(Protocol):
    @property
    def nodes(self) -> dict[str, NodeView]: ...

    @property
    def leading(self) -> bool: ...

    @property
    def term(self) -> int: ...


G = metrics_core.GaugeMetricFamily


class ClusterCollector(Collector):
    """The families above; ``replicas`` and ``node_certs`` are refreshed by the scrape's handler (store reads)."""

    def __init__(self, cluster: _Cluster, cert_files: Mapping[str, Path]) -> None:
        self.cluster = cluster
        self.cert_files = dict(cert_files)
        self.replicas: Sequence[ReplicaRecord] = ()
        self.node_certs: Sequence[StoredNodeCert] = ()

    def describe(self) -> list[metrics_core.Metric]:
        return []

    def collect(self) -> Iterator[metrics_core.Metric]:
        yield from self._nodes()
        yield from self._replicas()
        leading = bool(self.cluster.leading)
        yield G("llmgw_leader", "1 when this control plane leads the cluster, else 0 (a standby)", value=int(leading))
        yield G("llmgw_leader_term", "The leader lease's term this control plane last led at (0: never led); "
                "it moves at each change of leader", value=self.cluster.term if leading else 0)
        yield self._certificates()

    def _nodes(self) -> Iterator[metrics_core.Metric]:
        up = G("llmgw_node_up", "1 while the node's agent is connected to the leader, else 0", labels=["node"])
        total = G("llmgw_node_memory_total_bytes", "The node's memory", labels=["node"])
        free = G("llmgw_node_memory_available_bytes", "The node's memory available, at its last heartbeat",
                 labels=["node"])
        gpu_total = G("llmgw_gpu_memory_total_bytes", "Each GPU's memory", labels=["node", "gpu"])
        gpu_used = G("llmgw_gpu_memory_used_bytes", "Each GPU's memory in use, at the node's last heartbeat",
                     labels=["node", "gpu"])
        gpu_util = G("llmgw_gpu_utilization_ratio", "Each GPU's busy fraction (0..1) over the driver's last sample "
                     "period, at the node's last heartbeat; absent where its agent does not report it",
                     labels=["node", "gpu"])
        for node_id, view in sorted(self.cluster.nodes.items()):
            inv = view.inventory
            up.add_metric([node_id], 1 if view.connected else 0)
            total.add_metric([node_id], inv.memory_total_bytes)
            free.add_metric([node_id], inv.memory_available_bytes)
            for gpu in inv.gpus:
                gpu_total.add_metric([node_id, str(gpu.index)], gpu.memory_total_bytes)
                gpu_used.add_metric([node_id, str(gpu.index)], gpu.memory_used_bytes)
                if gpu.utilization_percent is not None:
                    gpu_util.add_metric([node_id, str(gpu.index)], gpu.utilization_percent / 100)
        yield from (up, total, free, gpu_total, gpu_used, gpu_util)

    def _replicas(self) -> Iterator[metrics_core.Metric]:
        counts: dict[str, dict[str, int]] = {}
        failures = G("llmgw_replica_failures", "A replica's failed starts in a row (0 once it is Ready)",
                     labels=["model", "replica"])
        for r in self.replicas:
            counts.setdefault(r.model, {p.value: 0 for p in Phase})[r.phase.value] += 1
            if r.id and r.phase is not Phase.READY:
                failures.add_metric([r.model, r.id], r.failures)
        by_phase = G("llmgw_model_replicas", "Replicas by model and phase", labels=["model", "phase"])
        for model, phases in sorted(counts.items()):
            for phase, n in phases.items():
                by_phase.add_metric([model, phase], n)
        yield by_phase
        yield failures

    def _certificates(self) -> metrics_core.Metric:
        out = G("llmgw_certificate_expiry_timestamp_seconds", "When the certificate stops being valid (unix "
                "seconds): the cluster CA, the API's, the agents' server's, and each node's client certificate",
                labels=["certificate", "node"])
        for name, path in sorted(self.cert_files.items()):
            try:
                out.add_metric([name, ""], pki.not_after(path.read_bytes()).timestamp())
            except (OSError, ValueError):
                continue  # not issued here (an operator's --tls-cert is read where it is given)
        newest: dict[str, StoredNodeCert] = {}
        for cert in self.node_certs:
            if not cert.revoked_at and (cert.node_id not in newest or cert.not_after > newest[cert.node_id].not_after):
                newest[cert.node_id] = cert
        for node_id, cert in sorted(newest.items()):
            out.add_metric(["node", node_id], cert.not_after)
        return out
