"""The series the dashboards and alerts read that are made at scrape time: the engines' own figures re-exported by
the router (``router.enginemetrics``, merged over workers by their largest value), and the cluster's
(``control.http.clustermetrics``: nodes, GPUs, replicas, leadership, certificates)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import prometheus_client as prom
from prometheus_client.parser import text_string_to_metric_families

from llmgw.control.http.clustermetrics import ClusterCollector
from llmgw.control.state import NodeView, Phase, ReplicaRecord
from llmgw.control.store.store import StoredNodeCert
from llmgw.core import pki
from llmgw.core.inventory import Gpu, Inventory
from llmgw.router import enginemetrics, metricsmerge
from llmgw.router.loadwatch import EngineLoad, engine_load, parse_gauges


def samples(collector: prom.registry.Collector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = prom.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
            for s in f.samples}


def test_engine_figures_come_from_the_engines_own_metrics_with_model_and_replica() -> None:
    """llama.cpp's exposition read by the load scrape becomes llmgw_engine_* with the table's model and replica;
    a figure the engine does not have (llama.cpp's KV cache) is left out, not exported as 0."""
    llamacpp = ("llamacpp:prompt_tokens_total 21\nllamacpp:tokens_predicted_total 8\n"
                "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n")
    vllm = ('vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
            'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0\n')
    collector = enginemetrics.EngineCollector()
    collector.source = lambda: [("tiny", "tiny-abc123", engine_load(parse_gauges(llamacpp))),
                                ("big", "big-def456", engine_load(parse_gauges(vllm)))]
    got = samples(collector)
    tiny = (("model", "tiny"), ("replica", "tiny-abc123"))
    big = (("model", "big"), ("replica", "big-def456"))
    assert got[("llmgw_engine_requests_running", tiny)] == 2
    assert got[("llmgw_engine_requests_waiting", tiny)] == 1
    assert got[("llmgw_engine_prompt_tokens_total", tiny)] == 21
    assert got[("llmgw_engine_generation_tokens_total", tiny)] == 8
    assert ("llmgw_engine_kv_cache_usage_ratio", tiny) not in got
    assert got[("llmgw_engine_kv_cache_usage_ratio", big)] == 0.25
    assert got[("llmgw_engine_generation_tokens_total", big)] == 40
    assert ("llmgw_engine_prompt_tokens_total", big) not in got
    assert {name for name, _ in got} <= set(enginemetrics.names())


def test_engine_figures_are_not_summed_over_workers_but_request_counts_are() -> None:
    """Two workers scraping the same engine say the same running count: the merge keeps it, not its double."""
    def worker(running: float, requests: float) -> str:
        return ("# TYPE llmgw_engine_requests_running gauge\n"
                f'llmgw_engine_requests_running{{model="m",replica="r"}} {running}\n'
                "# TYPE llmgw_engine_generation_tokens_total counter\n"
                'llmgw_engine_generation_tokens_total{model="m",replica="r"} 100\n'
                "# TYPE llmgw_router_requests_total counter\n"
                f'llmgw_router_requests_total{{model="m",replica="r",code="200"}} {requests}\n')
    merged = metricsmerge.merge_texts([worker(3, 5), worker(2, 7)]).decode()
    values = {(s.name, s.labels.get("model")): s.value for f in text_string_to_metric_families(merged)
              for s in f.samples}
    assert values[("llmgw_engine_requests_running", "m")] == 3
    assert values[("llmgw_engine_generation_tokens_total", "m")] == 100
    assert values[("llmgw_router_requests_total", "m")] == 12


@dataclasses.dataclass
class FakeLeadership:
    """The three things the collector reads of a ``Cluster`` (a real one needs a store and its loop)."""

    nodes: dict[str, NodeView]
    leading: bool
    term: int


def test_cluster_series_nodes_gpus_replicas_leader_and_certificates(tmp_path: Path) -> None:
    gpu = Gpu(index=0, uuid="GPU-1", name="H100", memory_total_bytes=80 << 30, memory_used_bytes=10 << 30)
    nodes = {"n1": NodeView("n1", Inventory(8, 64 << 30, 16 << 30, gpus=(gpu,)), connected=True),
             "n2": NodeView("n2", Inventory(8, 64 << 30, 60 << 30), connected=False)}
    ca = pki.create_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    collector = ClusterCollector(FakeLeadership(nodes, True, 7),
                                 {"ca": tmp_path / "ca.crt", "api": tmp_path / "not-issued.crt"})
    collector.replicas = [
        ReplicaRecord("", "m", "", Phase.READY, ""),  # Ready replicas come as one shared record per model
        ReplicaRecord("m-0a1b2c", "m", "", Phase.PENDING, "", failures=4),
        ReplicaRecord("z-3d4e5f", "z", "", Phase.STARTING, "", failures=0)]
    collector.node_certs = [StoredNodeCert("s1", "n1", 0.0, 1000.0, 0.0), StoredNodeCert("s2", "n1", 10.0, 2000.0, 0.0),
                            StoredNodeCert("s3", "n1", 20.0, 3000.0, 30.0)]  # revoked: not the one in use
    got = samples(collector)
    assert got[("llmgw_node_up", (("node", "n1"),))] == 1 and got[("llmgw_node_up", (("node", "n2"),))] == 0
    assert got[("llmgw_node_memory_available_bytes", (("node", "n2"),))] == 60 << 30
    assert got[("llmgw_gpu_memory_used_bytes", (("gpu", "0"), ("node", "n1")))] == 10 << 30
    assert not [k for k in got if k[0].startswith("llmgw_gpu") and ("node", "n2") in k[1]]
    assert got[("llmgw_model_replicas", (("model", "m"), ("phase", "Ready")))] == 1
    assert got[("llmgw_model_replicas", (("model", "m"), ("phase", "Pending")))] == 1
    assert got[("llmgw_model_replicas", (("model", "z"), ("phase", "Ready")))] == 0
    assert got[("llmgw_replica_failures", (("model", "m"), ("replica", "m-0a1b2c")))] == 4
    assert got[("llmgw_leader", ())] == 1 and got[("llmgw_leader_term", ())] == 7
    certs = {k[1]: v for k, v in got.items() if k[0] == "llmgw_certificate_expiry_timestamp_seconds"}
    assert certs == {(("certificate", "ca"), ("node", "")): pki.not_after(ca.cert_pem).timestamp(),
                     (("certificate", "node"), ("node", "n1")): 2000.0}

    standby = samples(ClusterCollector(FakeLeadership({}, False, 7), {}))
    assert standby[("llmgw_leader", ())] == 0 and standby[("llmgw_leader_term", ())] == 0
    assert not [k for k in standby if k[0] == "llmgw_node_up"]


def test_an_engine_load_without_token_counters_has_none() -> None:
    assert EngineLoad().generation_tokens is None
    assert engine_load(parse_gauges("llmgw_sim_requests_running 1\n")).prompt_tokens is None
