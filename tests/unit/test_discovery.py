"""Discovery: the nvidia-smi parser on a real-shaped fixture, NVML through a fake, and the host."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmgw.agent import discovery
from llmgw.agent.discovery import gpus, host, nvidia_smi
from llmgw.agent.discovery.deltas import HeartbeatBuilder
from llmgw.api import convert
from llmgw.api.v1 import agent_pb2 as pb
from llmgw.core.inventory import GpuProcess

FIXTURE = Path(__file__).parent.parent / "fixtures" / "nvidia-smi-q-x-2gpu.xml"
#: The same two H100s with two processes on GPU 1, as `nvidia-smi -q -x` lists them.
FIXTURE_PROCS = Path(__file__).parent.parent / "fixtures" / "nvidia-smi-q-x-2gpu-processes.xml"
MIB = 1 << 20


class FakeNvmlError(Exception):
    pass


def fake_nvml(devices: list[dict[str, object]], *, init_fails: bool = False) -> SimpleNamespace:
    """A stand-in for ``pynvml`` with the functions NVML reading uses.

    The process listings exist only when a device states "compute" or "graphics",
    as an nvidia-ml-py too old to have them would lack them.
    """

    def init() -> None:
        if init_fails:
            raise FakeNvmlError("NVML Shared Library Not Found")

    def get(key: str):
        def f(handle: int):
            value = devices[handle][key]
            if isinstance(value, Exception):
                raise value
            return value
        return f

    def listing(key: str):
        def f(handle: int):
            value = devices[handle].get(key, [])
            if isinstance(value, Exception):
                raise value
            return value
        return f

    module = SimpleNamespace(
        NVMLError=FakeNvmlError, nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=get("uuid"), nvmlDeviceGetName=get("name"),
        nvmlDeviceGetMemoryInfo=get("memory"), nvmlDeviceGetCudaComputeCapability=get("cc"),
    )
    if any("compute" in d or "graphics" in d for d in devices):
        module.nvmlDeviceGetComputeRunningProcesses = listing("compute")
        module.nvmlDeviceGetGraphicsRunningProcesses = listing("graphics")
    return module


def proc(pid: int, used: int | None) -> SimpleNamespace:
    """One entry of nvmlDeviceGet*RunningProcesses: nvidia-ml-py's friendly object has these fields."""
    return SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


def no_smi(name: str) -> None:
    return None


def test_parser_reads_both_gpus_of_the_fixture() -> None:
    """Two H100s: index by position, UUID, name and framebuffer (not BAR1) memory."""
    found = discovery.parse_nvidia_smi_xml(FIXTURE.read_text())
    assert [g.index for g in found] == [0, 1]
    assert found[0].uuid == "GPU-6d5e8f3a-2b1c-7f4e-9a0d-3c8b1e5f7a21"
    assert {g.name for g in found} == {"NVIDIA H100 80GB HBM3"}
    assert found[0].memory_total_bytes == 81559 * MIB
    assert (found[0].memory_used_bytes, found[1].memory_used_bytes) == (1 * MIB, 71570 * MIB)
    assert found[1].compute_capability == ""


def test_parser_treats_na_memory_as_zero_and_refuses_non_xml() -> None:
    """``N/A`` memory reads as 0; text that is not nvidia-smi's XML is an NvidiaSmiError."""
    text = "<nvidia_smi_log><gpu><uuid>GPU-x</uuid><fb_memory_usage><total>N/A</total>" \
           "</fb_memory_usage></gpu></nvidia_smi_log>"
    (gpu,) = discovery.parse_nvidia_smi_xml(text)
    assert (gpu.uuid, gpu.memory_total_bytes, gpu.memory_used_bytes) == ("GPU-x", 0, 0)
    with pytest.raises(discovery.NvidiaSmiError, match="not XML"):
        discovery.parse_nvidia_smi_xml("NVIDIA-SMI has failed because it couldn't communicate")
    with pytest.raises(discovery.NvidiaSmiError, match="<html>"):
        discovery.parse_nvidia_smi_xml("<html/>")


def test_nvidia_smi_failure_and_timeout_become_nvidia_smi_errors() -> None:
    """A non-zero exit names its last line; a hang names the timeout."""
    def failed(argv, **kw):
        return subprocess.CompletedProcess(argv, 9, stdout="NVIDIA-SMI has failed\n", stderr="")

    def hangs(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    with pytest.raises(discovery.NvidiaSmiError, match="code 9: NVIDIA-SMI has failed"):
        nvidia_smi.read_nvidia_smi("/usr/bin/nvidia-smi", run=failed)
    with pytest.raises(discovery.NvidiaSmiError, match="did not answer in 3 s"):
        nvidia_smi.read_nvidia_smi("/usr/bin/nvidia-smi", timeout_s=3, run=hangs)


def test_nvml_reports_capability_and_leaves_out_a_lost_gpu() -> None:
    """NVML GPUs carry "major.minor"; one that raises (GPU is lost) is not reported as empty."""
    mem = SimpleNamespace(total=80 * 1024 * MIB, used=512 * MIB)
    module = fake_nvml([
        {"uuid": b"GPU-a", "name": "NVIDIA H100 80GB HBM3", "memory": mem, "cc": (9, 0)},
        {"uuid": "GPU-b", "name": "NVIDIA H100 80GB HBM3", "memory": FakeNvmlError("GPU is lost"),
         "cc": (9, 0)},
    ])
    found = gpus.GpuReader(nvml_module=module, which=no_smi).read()
    assert [(g.index, g.uuid, g.compute_capability, g.memory_used_bytes) for g in found] == [
        (0, "GPU-a", "9.0", 512 * MIB)]


def test_falls_back_to_nvidia_smi_only_when_nvml_fails_and_the_binary_exists() -> None:
    """NVML failing with nvidia-smi present reads the XML; with neither there are no GPUs."""
    calls: list[list[str]] = []

    def run(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=FIXTURE.read_text(), stderr="")

    broken = fake_nvml([], init_fails=True)
    reader = gpus.GpuReader(nvml_module=broken, which=lambda n: "/usr/bin/" + n, run=run)
    assert len(reader.read()) == 2
    assert calls == [["/usr/bin/nvidia-smi", "-q", "-x"]]
    assert gpus.GpuReader(nvml_module=broken, which=no_smi, run=run).read() == ()
    assert len(calls) == 1


def test_os_release_parsing() -> None:
    """ID and VERSION_ID, quotes removed, comments ignored."""
    fields = host.parse_os_release('# comment\nID=ubuntu\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu"\n')
    assert (fields["ID"], fields["VERSION_ID"]) == ("ubuntu", "22.04")


def test_disk_of_a_missing_model_dir_is_its_nearest_existing_parent(tmp_path: Path) -> None:
    """A weights cache not created yet reports the filesystem it will land on, and is not created."""
    missing = tmp_path / "not" / "yet"
    (disk,) = host.disks([missing])
    assert disk.path == str(missing) and disk.total_bytes > 0 and 0 <= disk.free_bytes <= disk.total_bytes
    assert not missing.exists()


def test_discover_on_this_machine(tmp_path: Path) -> None:
    """Sane CPU, memory, disk, OS and arch; GPUs from the injected reader; engines from the callable."""
    os_release = tmp_path / "os-release"
    os_release.write_text('ID=ubuntu\nVERSION_ID="24.04"\n')
    reader = gpus.GpuReader(nvml_module=fake_nvml([], init_fails=True), which=no_smi)
    inv = discovery.discover(model_dirs=[tmp_path], gpu_reader=reader, os_release=os_release,
                             engines=lambda: [("sim", "0.1.0")])
    assert inv.cpu_count >= 1
    assert 0 < inv.memory_available_bytes <= inv.memory_total_bytes
    assert [d.path for d in inv.disks] == [str(tmp_path)]
    assert inv.gpus == ()
    assert (inv.os, inv.engines) == ("ubuntu 24.04", (("sim", "0.1.0"),))
    assert inv.arch


def test_discover_with_real_nvml_never_raises_without_a_driver(tmp_path: Path) -> None:
    """The real pynvml on a machine without a driver gives no GPUs, not an exception."""
    inv = discovery.discover(model_dirs=[tmp_path], nvidia_smi="llmgw-no-such-nvidia-smi",
                             engines=lambda: [])
    assert inv.cpu_count >= 1 and inv.os


def test_load_sampler_measures_and_rereads_gpus(tmp_path: Path) -> None:
    """Each sample re-reads GPU memory used; CPU percent and load are numbers within range."""
    mem = SimpleNamespace(total=100, used=10)
    module = fake_nvml([{"uuid": "GPU-a", "name": "g", "memory": mem, "cc": (8, 6)}])
    sampler = discovery.LoadSampler(model_dirs=[tmp_path],
                                    gpu_reader=gpus.GpuReader(nvml_module=module, which=no_smi))
    first = sampler.sample()
    mem.used = 60
    second = sampler.sample()
    sampler.close()
    assert (first.gpus[0].memory_used_bytes, second.gpus[0].memory_used_bytes) == (10, 60)
    assert 0.0 <= second.cpu_percent <= 100.0 and second.load1 >= 0.0
    assert 0 < second.memory_available_bytes <= second.memory_total_bytes
    assert [d.path for d in second.disks] == [str(tmp_path)]


def test_no_gpus_is_said_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """Repeated reads on a node without NVML or nvidia-smi log the reason once, at info level."""
    caplog.set_level("INFO", logger="llmgw.agent.discovery")
    broken = fake_nvml([], init_fails=True)
    for _ in range(3):
        reader = gpus.GpuReader(nvml_module=broken, which=no_smi, nvidia_smi_path="smi-once-test")
        assert reader.read() == () and reader.read() == ()
    said = [r for r in caplog.records if "smi-once-test" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "INFO"
    assert "NVML Shared Library Not Found" in said[0].getMessage()


def test_parser_reads_the_processes_on_each_gpu() -> None:
    """<process_info> entries become GpuProcess by pid, named by the executable's last path part."""
    found = discovery.parse_nvidia_smi_xml(FIXTURE_PROCS.read_text())
    assert found[0].processes == ()
    assert found[1].processes == (GpuProcess(1234, 75000 * MIB, "python3"), GpuProcess(5678, 12 * MIB, "Xorg"))
    assert found[1].memory_used_bytes == 75562 * MIB
    # The older fixture's single process, named by its full path there.
    assert discovery.parse_nvidia_smi_xml(FIXTURE.read_text())[1].processes == (
        GpuProcess(48213, 71020 * MIB, "python3"),)


def test_parser_reads_na_process_memory_as_zero_and_skips_unreadable_pids() -> None:
    """Under MIG used_memory is N/A (0, not an error); an entry without a number for a pid is left out."""
    text = ("<nvidia_smi_log><gpu><uuid>GPU-x</uuid><processes>"
            "<process_info><pid>77</pid><type>C</type><process_name>llama-server</process_name>"
            "<used_memory>N/A</used_memory></process_info>"
            "<process_info><pid>N/A</pid><process_name>ghost</process_name><used_memory>5 MiB</used_memory>"
            "</process_info></processes></gpu></nvidia_smi_log>")
    (gpu,) = discovery.parse_nvidia_smi_xml(text)
    assert gpu.processes == (GpuProcess(77, 0, "llama-server"),)


def test_nvml_lists_compute_and_graphics_processes_once_each(tmp_path: Path) -> None:
    """Both listings merge by pid; None and NOT_AVAILABLE memory read 0; names from /proc/PID/comm when visible."""
    (tmp_path / "1234").mkdir()
    (tmp_path / "1234" / "comm").write_text("python3\n")
    (tmp_path / "4321").mkdir()
    (tmp_path / "4321" / "comm").write_text("Xorg\n")
    mem = SimpleNamespace(total=80 * 1024 * MIB, used=75 * 1024 * MIB)
    module = fake_nvml([
        {"uuid": "GPU-a", "name": "H100", "memory": mem, "cc": (9, 0),
         "compute": [proc(1234, 75 * 1024 * MIB), proc(999, None), proc(555, (1 << 64) - 1)],
         "graphics": [proc(4321, 8 * MIB), proc(1234, 75 * 1024 * MIB)]},
        # Listing refused (NO_PERMISSION in some containers): the GPU stays, without pids.
        {"uuid": "GPU-b", "name": "H100", "memory": mem, "cc": (9, 0),
         "compute": FakeNvmlError("Insufficient Permissions"), "graphics": FakeNvmlError("Not Supported")},
    ])
    found = gpus.GpuReader(nvml_module=module, which=no_smi, proc_root=tmp_path).read()
    assert found[0].processes == (GpuProcess(555, 0, ""), GpuProcess(999, 0, ""),
                                  GpuProcess(1234, 75 * 1024 * MIB, "python3"), GpuProcess(4321, 8 * MIB, "Xorg"))
    assert [g.uuid for g in found] == ["GPU-a", "GPU-b"] and found[1].processes == ()


def test_nvml_without_process_listings_reports_none() -> None:
    """An nvidia-ml-py without nvmlDeviceGet*RunningProcesses still reports the GPU, with no processes."""
    mem = SimpleNamespace(total=100, used=10)
    (gpu,) = gpus.GpuReader(nvml_module=fake_nvml([{"uuid": "GPU-a", "name": "g", "memory": mem, "cc": (8, 6)}]),
                            which=no_smi).read()
    assert (gpu.uuid, gpu.processes) == ("GPU-a", ())


def test_processes_travel_in_every_heartbeat(tmp_path: Path) -> None:
    """Sampled processes go through the heartbeat builder and the wire unchanged, and follow a change."""
    (tmp_path / "1234").mkdir()
    (tmp_path / "1234" / "comm").write_text("python3\n")
    mem = SimpleNamespace(total=80 * 1024 * MIB, used=75 * 1024 * MIB)
    device: dict[str, object] = {"uuid": "GPU-a", "name": "H100", "memory": mem, "cc": (9, 0),
                                 "compute": [proc(1234, 75 * 1024 * MIB)]}
    sampler = discovery.LoadSampler(model_dirs=[tmp_path], gpu_reader=gpus.GpuReader(
        nvml_module=fake_nvml([device]), which=no_smi, proc_root=tmp_path))
    builder = HeartbeatBuilder()

    def over_the_wire() -> tuple[GpuProcess, ...]:
        wire = convert.heartbeat_to_pb(builder.build(sampler.sample())).SerializeToString()
        (gpu,) = convert.heartbeat_from_pb(pb.Heartbeat.FromString(wire)).gpus
        return gpu.processes

    try:
        assert over_the_wire() == (GpuProcess(1234, 75 * 1024 * MIB, "python3"),)
        device["compute"] = []  # the job ended
        assert over_the_wire() == ()
    finally:
        sampler.close()


def test_registration_and_the_stored_inventory_keep_the_processes() -> None:
    """Register carries the processes, and the store's dict form (asdict) reads back to equal GPUs."""
    import dataclasses

    from llmgw.core.inventory import Inventory, inventory_from_dict

    found = discovery.parse_nvidia_smi_xml(FIXTURE_PROCS.read_text())
    inv = Inventory(cpu_count=8, memory_total_bytes=1, memory_available_bytes=1, gpus=found)
    wire = pb.Register(**convert.register_fields(inv)).SerializeToString()  # type: ignore[arg-type]
    assert convert.inventory_from_register(pb.Register.FromString(wire)).gpus == found
    assert inventory_from_dict(dataclasses.asdict(inv)).gpus == found
    # A dict an older control plane stored has no processes key.
    old = dataclasses.asdict(inv)
    for g in old["gpus"]:
        del g["processes"]
    assert inventory_from_dict(old).gpus[1].processes == ()
