"""Heartbeat deltas and rescan pacing, per-shard load, the sampler's new fields, and the full discover()."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from llmgw.agent import discovery
from llmgw.agent.discovery import gpus, procload
from llmgw.agent.discovery.deltas import HeartbeatBuilder, Rescanner
from llmgw.agent.discovery.load import Load
from llmgw.core.inventory import Fabric, Inventory, ModelDir, NvlinkFabric, WeightFile

FIXTURES = Path(__file__).parent.parent / "fixtures"
SYSFS = FIXTURES / "sysfs" / "class" / "infiniband"
W1 = (WeightFile("/m/a.gguf", 10, "gguf"),)
LOAD = Load(memory_total_bytes=100, memory_available_bytes=50, cpu_percent=1.0, load1=0.5, load5=0.4, load15=0.3)


def test_after_baseline_unchanged_parts_are_none_and_changes_are_sent() -> None:
    """A Register's inventory is the baseline; a changed list is sent once; an emptied one is () not None."""
    builder = HeartbeatBuilder()
    builder.baseline(Inventory(cpu_count=1, memory_total_bytes=1, memory_available_bytes=1, weights=W1,
                               engines=(("sim", "0.1"),), fabrics=(Fabric("ib-a", ("mlx5_0",)),)))
    hb = builder.build(LOAD, weights=W1, engines=(("sim", "0.1"),), fabrics=(Fabric("ib-a", ("mlx5_0",)),),
                       model_dirs=(), subnet_managers=())
    assert (hb.weights, hb.engines, hb.fabrics, hb.model_dirs, hb.subnet_managers, hb.nvlink) == (None,) * 6
    assert (hb.load5, hb.load15, hb.memory_available_bytes) == (0.4, 0.3, 50)
    w2 = (*W1, WeightFile("/m/llama", 99, "safetensors"))
    assert builder.build(LOAD, weights=w2).weights == w2
    assert builder.build(LOAD, weights=w2).weights is None
    assert builder.build(LOAD, weights=()).weights == ()
    assert builder.build(LOAD, weights=None, fabrics=()).fabrics == ()
    assert builder.build(LOAD).weights is None  # not measured this beat: unchanged


def test_a_new_stream_resends_what_differs_from_its_registration() -> None:
    """Before any baseline everything given is sent; a re-baseline forgets what the old stream heard."""
    builder = HeartbeatBuilder()
    dirs = (ModelDir("/m", 10, 5),)
    assert builder.build(LOAD, model_dirs=dirs).model_dirs == dirs
    builder.baseline(Inventory(cpu_count=1, memory_total_bytes=1, memory_available_bytes=1))
    assert builder.build(LOAD, model_dirs=dirs).model_dirs == dirs
    nv = NvlinkFabric(state="Completed")
    assert builder.build(LOAD, nvlink=nv).nvlink == nv  # passes through: the probe already paced it


def test_rescanner_paces_expensive_scans() -> None:
    """First get scans; within the interval gets are None (unchanged); expire() makes the next one scan."""
    calls, now = [], [0.0]

    def scan() -> tuple[WeightFile, ...]:
        calls.append(now[0])
        return W1

    weights = Rescanner(scan, interval_s=30.0, clock=lambda: now[0])
    assert weights.get() == W1
    now[0] = 29.0
    assert weights.get() is None
    now[0] = 30.0
    assert weights.get() == W1
    weights.expire()
    assert weights.get() == W1 and calls == [0.0, 30.0, 30.0]


def test_shard_load_of_this_process() -> None:
    """The first sample of a pid primes and omits it; the next reports cores and RSS; a dead pid is skipped."""
    sampler = procload.ShardLoadSampler()
    # Above the largest pid_max Linux allows (2**22), so never a live process.
    pids = {"me": os.getpid(), "gone": (1 << 22) + 1}
    assert sampler.sample(pids) == ()
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    (me,) = sampler.sample(pids)
    assert me.shard_id == "me" and me.cpu_cores > 0.0 and me.rss_bytes > 1 << 20
    assert sampler.sample({}) == () and sampler.sample({"me": os.getpid()}) == ()  # forgotten, so primes again


def no_nvml() -> SimpleNamespace:
    class Err(Exception):
        pass

    def fail() -> None:
        raise Err("NVML Shared Library Not Found")

    return SimpleNamespace(NVMLError=Err, nvmlInit=fail)


def test_load_sampler_adds_load_averages_hcas_and_shards(tmp_path: Path) -> None:
    """load5/load15, the adapters re-read from sysfs, and per-shard load from {shard: pid}."""
    reader = gpus.GpuReader(nvml_module=no_nvml(), which=lambda n: None)
    sampler = discovery.LoadSampler(model_dirs=[tmp_path], gpu_reader=reader, sysfs_root=SYSFS)
    first = sampler.sample(shard_pids={"s": os.getpid()})
    second = sampler.sample(shard_pids={"s": os.getpid()})
    assert [h.name for h in first.hcas] == ["mlx5_0", "mlx5_1"] and first.shard_load == ()
    assert second.load5 >= 0.0 and second.load15 >= 0.0 and [s.shard_id for s in second.shard_load] == ["s"]


def test_discover_returns_the_full_inventory(tmp_path: Path) -> None:
    """Host facts, adapters, loudly-checked fabrics, model dirs, weights and the management interface."""
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    reader = gpus.GpuReader(nvml_module=no_nvml(), which=lambda n: None)
    inv = discovery.discover(
        model_dirs=[tmp_path], gpu_reader=reader, engines=lambda: [], sysfs_root=SYSFS, mgmt_addr="127.0.0.1",
        os_release=FIXTURES / "host" / "os-release-ubuntu-24.04", cpuinfo=FIXTURES / "host" / "cpuinfo-x86_64",
        declared_fabrics=[("ib-a", ["mlx5_0"]), ("gone", ["mlx5_9"])],
        sm_probe=discovery.SubnetManagerProbe(which=lambda n: None), mounts=[("/", "nfs")])
    assert (inv.host.os_codename, inv.mgmt_interface) == ("noble", "lo")
    assert [h.name for h in inv.hcas] == ["mlx5_0", "mlx5_1"]
    assert inv.fabrics == (Fabric("ib-a", ("mlx5_0",)),)
    assert inv.weights == (WeightFile(str(tmp_path / "tiny.gguf"), 4, "gguf"),)
    assert [(d.path, d.shared, d.fs_type) for d in inv.model_dirs] == [(str(tmp_path), True, "nfs")]
    assert inv.nvlink == NvlinkFabric() and inv.subnet_managers == ()


class OneGpu:
    """A pynvml stand-in with one GPU and no NVLink functions (as an old nvidia-ml-py)."""

    class NVMLError(Exception):
        pass

    nvmlInit = nvmlShutdown = staticmethod(lambda: None)
    nvmlDeviceGetCount = staticmethod(lambda: 1)
    nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
    nvmlDeviceGetUUID = nvmlDeviceGetName = staticmethod(lambda h: "GPU-0")
    nvmlDeviceGetMemoryInfo = staticmethod(lambda h: SimpleNamespace(total=1 << 30, used=0))
    nvmlDeviceGetCudaComputeCapability = staticmethod(lambda h: (9, 0))
    nvmlSystemGetDriverVersion = staticmethod(lambda: "570.133.20")


def test_discover_takes_the_nvlink_probes_last_answer_when_it_is_not_due(tmp_path: Path) -> None:
    """A shared probe sampled by a heartbeat a moment ago gives its last value to a reconnect's Register."""
    now = [0.0]

    def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, stdout=(FIXTURES / "nvidia-smi-q-gb200.txt").read_text())

    probe = discovery.NvlinkProbe(run=run, clock=lambda: now[0], which=lambda n: None if "imex" in n else n)
    first = probe.sample()
    assert first is not None and first.clique_id == "32766"
    inv = discovery.discover(model_dirs=[], gpu_reader=gpus.GpuReader(nvml_module=OneGpu(), which=lambda n: None),
                             engines=lambda: [], sysfs_root=tmp_path, nvlink_probe=probe)
    assert inv.nvlink == first and len(inv.gpus) == 1 and inv.host.nvidia_driver == "570.133.20"
