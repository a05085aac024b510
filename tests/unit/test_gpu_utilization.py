"""Each GPU's utilisation (issue 30), end to end: read by both discovery paths (NVML and ``nvidia-smi -q -x``),
carried by the wire with "unknown" kept apart from 0 %, charted by the history, exported to Prometheus only where
known, and left out of the stored inventory document that the previous release (0.1.0) must still read."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import prometheus_client as prom
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent import discovery
from llmgw.agent.discovery import gpus as gpus_mod
from llmgw.agent.discovery.deltas import HeartbeatBuilder
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.cli import describe, tables
from llmgw.control.agentsvc.inbound import _reuse_gpus
from llmgw.control.history import MetricsHistory
from llmgw.control.http.clustermetrics import ClusterCollector
from llmgw.control.http.nodedocs import node_doc
from llmgw.control.state import NodeView
from llmgw.control.store.nodes import StoredNode, inventory_from_doc, inventory_to_doc
from llmgw.core.inventory import Gpu, GpuProcess, Heartbeat, Inventory

FIXTURES = Path(__file__).parent.parent / "fixtures"
T0 = 1_700_000_000.0
#: The fields of ``Gpu`` in release 0.1.0 (d6cd860), whose reader is ``Gpu(**doc)``: an extra key is a TypeError.
GPU_FIELDS_0_1_0 = {"index", "uuid", "name", "memory_total_bytes", "memory_used_bytes", "compute_capability",
                    "nvlink_peers", "pci_bus_id", "processes"}


class FakeNvmlError(Exception):
    pass


class NotSupportedError(FakeNvmlError):
    """As pynvml's NVMLError_NotSupported: a subclass of its NVMLError."""


def nvml(devices: list[dict[str, object]]) -> SimpleNamespace:
    """A stand-in for ``pynvml`` (this machine has no GPU): each device's memory and utilisation, or an error."""
    def get(key: str):  # type: ignore[no-untyped-def]
        def f(handle: int):  # type: ignore[no-untyped-def]
            value = devices[handle][key]
            if isinstance(value, Exception):
                raise value
            return value
        return f
    return SimpleNamespace(
        NVMLError=FakeNvmlError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=get("uuid"), nvmlDeviceGetName=lambda h: "H100", nvmlDeviceGetMemoryInfo=get("memory"),
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0), nvmlDeviceGetUtilizationRates=get("util"))


def gpu(i: int, util: int | None) -> Gpu:
    return Gpu(index=i, uuid=f"GPU-{i}", name="H100", memory_total_bytes=80 << 30, memory_used_bytes=(10 + i) << 30,
               processes=(GpuProcess(100 + i, 1 << 30, "python3"),), utilization_percent=util)


def test_nvidia_smi_reads_gpu_util_and_na_as_unknown() -> None:
    """Both captured fixtures say 0 % and 37 %; "N/A" (vGPU, MIG) and no <utilization> at all are unknown."""
    for name in ("nvidia-smi-q-x-2gpu.xml", "nvidia-smi-q-x-2gpu-processes.xml"):
        found = discovery.parse_nvidia_smi_xml((FIXTURES / name).read_text())
        assert [g.utilization_percent for g in found] == [0, 37], name
    na = ("<nvidia_smi_log><gpu><uuid>GPU-x</uuid><utilization><gpu_util>N/A</gpu_util></utilization></gpu>"
          "<gpu><uuid>GPU-y</uuid></gpu><gpu><uuid>GPU-z</uuid><utilization><gpu_util>100 %</gpu_util>"
          "</utilization></gpu></nvidia_smi_log>")
    assert [g.utilization_percent for g in discovery.parse_nvidia_smi_xml(na)] == [None, None, 100]


def test_nvml_reads_utilization_and_not_supported_as_unknown() -> None:
    mem = SimpleNamespace(total=80 << 30, used=1 << 30)
    module = nvml([{"uuid": "GPU-a", "memory": mem, "util": SimpleNamespace(gpu=63, memory=20)},
                   {"uuid": "GPU-b", "memory": mem, "util": NotSupportedError("Not Supported")},
                   {"uuid": "GPU-c", "memory": mem, "util": SimpleNamespace(gpu=0, memory=0)}])
    found = gpus_mod.GpuReader(nvml_module=module, which=lambda name: None).read()
    # NotSupported is unknown, and the GPU itself is still reported (not left out as a lost one).
    assert [(g.uuid, g.utilization_percent) for g in found] == [("GPU-a", 63), ("GPU-b", None), ("GPU-c", 0)]
    del module.nvmlDeviceGetUtilizationRates  # an nvidia-ml-py without it
    assert {g.utilization_percent for g in gpus_mod.GpuReader(nvml_module=module, which=lambda n: None).read()} \
        == {None}


def test_the_wire_keeps_zero_apart_from_unknown_and_an_older_agent_reads_as_unknown() -> None:
    sent = (gpu(0, 0), gpu(1, 37), gpu(2, None))
    hb = HeartbeatBuilder().build(SimpleNamespace(  # type: ignore[arg-type]
        memory_total_bytes=1, memory_available_bytes=1, cpu_percent=0.0, load1=0.0, load5=0.0, load15=0.0,
        gpus=sent, disks=(), hcas=(), shard_load=()))
    wire = convert.heartbeat_to_pb(hb).SerializeToString()
    assert convert.heartbeat_from_pb(pb.Heartbeat.FromString(wire)).gpus == sent
    inv = Inventory(cpu_count=8, memory_total_bytes=1, memory_available_bytes=1, gpus=sent)
    reg = pb.Register(**convert.register_fields(inv)).SerializeToString()  # type: ignore[arg-type]
    assert convert.inventory_from_register(pb.Register.FromString(reg)).gpus == sent
    # An older agent's Gpu has neither field: unknown, not 0 %.
    old = pb.Gpu(index=0, uuid="GPU-old", name="A100", memory_total_bytes=1, memory_used_bytes=1)
    assert convert.gpus_from_pb([pb.Gpu.FromString(old.SerializeToString())])[0].utilization_percent is None
    # Utilisation rides in every heartbeat with the GPUs (as memory used does): 2 fields, at most 4 bytes a GPU.
    no_util = convert.heartbeat_to_pb(dataclasses.replace(hb, gpus=tuple(
        dataclasses.replace(g, utilization_percent=None) for g in sent)))
    assert 0 < len(wire) - len(no_util.SerializeToString()) <= 4 * len(sent)


def test_the_stored_document_leaves_utilisation_out_for_the_previous_release() -> None:
    """0.1.0 reads a node's inventory with ``Gpu(**doc)``: the stored document has only the keys it knows, and
    this release reads it (and a document written before this release) with utilisation unknown."""
    inv = Inventory(cpu_count=8, memory_total_bytes=1, memory_available_bytes=1, gpus=(gpu(0, 37), gpu(1, None)))
    doc = inventory_to_doc(inv)
    assert all(set(g) <= GPU_FIELDS_0_1_0 for g in doc["gpus"]), doc["gpus"]
    back = inventory_from_doc(doc)
    assert back.gpus == (gpu(0, None), gpu(1, None))
    assert inventory_to_doc(inv)["gpus"][0]["memory_used_bytes"] == 10 << 30  # the rest is kept


def test_history_charts_each_gpus_utilisation_with_gaps_where_unknown() -> None:
    h = MetricsHistory()
    h.heartbeat("n1", Heartbeat(memory_total_bytes=1, memory_available_bytes=1, gpus=(gpu(0, 37), gpu(1, None))), T0)
    view = h.view("node", "n1", 3600, T0 + 1)
    assert view is not None
    (util,) = [c for c in view.charts if c.title == "GPU utilisation"]
    assert util.unit == "%"
    assert {ln.name: ln.values[-1] for ln in util.lines} == {"gpu0": 37.0, "gpu1": None}
    assert [c.title for c in view.charts].index("GPU utilisation") == \
        [c.title for c in view.charts].index("GPU memory") + 1  # beside GPU memory


def test_prometheus_exports_a_ratio_only_for_gpus_that_report_it() -> None:
    nodes = {"n1": NodeView("n1", Inventory(8, 1, 1, gpus=(gpu(0, 37), gpu(1, None))), connected=True)}
    cluster = SimpleNamespace(nodes=nodes, leading=True, term=1)
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(cluster, {}))  # type: ignore[arg-type]
    text = prom.generate_latest(registry).decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text)
           for s in f.samples if s.name == "llmgw_gpu_utilization_ratio"}
    assert got == {("llmgw_gpu_utilization_ratio", (("gpu", "0"), ("node", "n1"))): 0.37}


def test_the_node_document_and_the_wide_listing_say_null_where_unknown() -> None:
    inv = Inventory(cpu_count=8, memory_total_bytes=1, memory_available_bytes=1, gpus=(gpu(0, 37), gpu(1, None)))
    stored = StoredNode("n1", "h", "", "", inv, {}, T0, T0)
    doc = node_doc(stored, NodeView("n1", inv, connected=True), connected=True, has_replicas=False)
    assert [g["utilization_percent"] for g in doc["gpus"]] == [37, None]
    assert tables.gpu_util_cell(doc) == "37%,?"
    assert tables.gpu_util_cell({"gpus": []}) == "-"
    # describe node: how busy where known; a server before this release sends no key, and the name is all.
    assert [describe._gpu(g) for g in doc["gpus"]] == ["H100 (37% busy)", "H100"]
    assert describe._gpu({"name": "A100"}) == "A100"


def test_a_busy_gpu_is_new_each_beat_but_the_others_and_its_processes_are_kept() -> None:
    held = (gpu(0, 10), gpu(1, 0))
    same = _reuse_gpus((gpu(0, 10), gpu(1, 0)), held)
    assert same is held
    moved = _reuse_gpus((gpu(0, 55), gpu(1, 0)), held)
    assert moved == (gpu(0, 55), gpu(1, 0))
    assert moved[1] is held[1] and moved[0].processes is held[0].processes
