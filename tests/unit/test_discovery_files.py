"""Weights on disk, model directories' filesystems, fingerprints, and the host's facts and interface."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmgw.agent.discovery import files, host
from llmgw.core.inventory import ModelDir, WeightFile

HOST = Path(__file__).parent.parent / "fixtures" / "host"


def write(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)


def test_weights_scan_finds_gguf_files_and_safetensors_dirs(tmp_path: Path) -> None:
    """A .gguf is one entry; a config.json + safetensors dir is one entry sized by its files; junk is not."""
    write(tmp_path / "tiny.gguf", 100)
    write(tmp_path / "deep" / "a" / "b" / "qwen.Q4_K_M.gguf", 7)
    llama = tmp_path / "llama"
    for name, size in (("config.json", 10), ("model-00001-of-00002.safetensors", 1000),
                       ("model-00002-of-00002.safetensors", 500), ("tokenizer.json", 20)):
        write(llama / name, size)
    write(llama / "original" / "inner.gguf", 1)  # inside a model directory: not descended into
    write(tmp_path / "notes.txt", 5)
    write(tmp_path / "half.gguf.part", 5)
    write(tmp_path / "only-safetensors" / "x.safetensors", 5)  # no config.json: not a model
    write(tmp_path / ".cache" / "partial.gguf", 5)
    (tmp_path / "broken.gguf").symlink_to(tmp_path / "gone")
    assert files.scan_weights([tmp_path]) == (
        WeightFile(str(tmp_path / "deep" / "a" / "b" / "qwen.Q4_K_M.gguf"), 7, "gguf"),
        WeightFile(str(llama), 1530, "safetensors"),
        WeightFile(str(tmp_path / "tiny.gguf"), 100, "gguf"),
    )


def test_weights_scan_survives_symlink_loops_depth_and_missing_dirs(tmp_path: Path) -> None:
    """A loop is walked once, depth is bounded, a missing root is nothing, and a linked model counts its blobs."""
    write(tmp_path / "m" / "a.gguf", 3)
    (tmp_path / "m" / "loop").symlink_to(tmp_path / "m")
    write(tmp_path / "blobs" / "abc", 64)
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / "0123"
    write(snap / "config.json", 2)
    (snap / "model.safetensors").symlink_to(tmp_path / "blobs" / "abc")
    write(tmp_path / "1" / "2" / "3" / "4" / "5" / "too-deep.gguf", 1)
    found = files.scan_weights([tmp_path, tmp_path / "m", tmp_path / "absent"])
    assert [(Path(w.path).relative_to(tmp_path).as_posix(), w.size_bytes) for w in found] == [
        ("hub/models--org--name/snapshots/0123", 66), ("m/a.gguf", 3)]


def test_shared_filesystem_is_the_longest_mount_prefix(tmp_path: Path) -> None:
    """The mount a directory is on decides shared/fs_type; /mnt/lustre2 is not under /mnt/lustre."""
    mounts = [("/", "ext4"), ("/mnt/lustre", "lustre"), ("/mnt/lustre2", "xfs"), (str(tmp_path), "nfs4")]
    assert files.mount_of("/mnt/lustre/models", mounts) == ("/mnt/lustre", "lustre")
    assert files.mount_of("/mnt/lustre2/models", mounts) == ("/mnt/lustre2", "xfs")
    assert files.mount_of("/srv", mounts) == ("/", "ext4")

    def usage(path: str) -> SimpleNamespace:
        return SimpleNamespace(total=1000, free=400)

    missing = tmp_path / "cache" / "not-yet"
    assert files.model_dirs([missing], mounts=mounts, disk_usage=usage) == (
        ModelDir(path=str(missing), total_bytes=1000, free_bytes=400, shared=True, fs_type="nfs4"),)
    assert not missing.exists()
    assert files.model_dirs([Path("/srv")], mounts=mounts, disk_usage=usage)[0].shared is False
    (this,) = files.model_dirs([tmp_path])  # the real mount table and statvfs
    assert this.total_bytes > 0 and this.fs_type


def test_fingerprint_tells_data_apart() -> None:
    """Equal data, equal fingerprint; a size change, an empty tuple or a reorder differs."""
    a = (WeightFile("/m/a.gguf", 1, "gguf"),)
    assert files.fingerprint(a) == files.fingerprint((WeightFile("/m/a.gguf", 1, "gguf"),))
    assert len({files.fingerprint(x) for x in (a, (WeightFile("/m/a.gguf", 2, "gguf"),), (), None)}) == 4
    assert files.fingerprint((("sim", "1"), ("vllm", "2"))) != files.fingerprint((("vllm", "2"), ("sim", "1")))


def test_host_facts_from_fixtures() -> None:
    """os-release id/version/codename, sorted CPU flags (x86 flags, Arm Features), driver NVML first."""
    facts = host.facts(os_release=HOST / "os-release-ubuntu-24.04", cpuinfo=HOST / "cpuinfo-x86_64",
                       nvidia_proc=HOST / "proc-driver-nvidia-version")
    assert (facts.os_id, facts.os_version, facts.os_codename) == ("ubuntu", "24.04", "noble")
    assert "avx2" in facts.cpu_flags and list(facts.cpu_flags) == sorted(set(facts.cpu_flags))
    assert facts.nvidia_driver == "570.133.20" and facts.arch and facts.kernel
    arm = host.facts(cpuinfo=HOST / "cpuinfo-aarch64", os_release=HOST / "absent",
                     driver_version=lambda: "575.51.03", nvidia_proc=HOST / "absent")
    assert {"sve2", "bf16"} <= set(arm.cpu_flags) and arm.nvidia_driver == "575.51.03" and arm.os_id == ""


def test_driver_version_from_proc_and_nvml_failure(tmp_path: Path) -> None:
    """The proprietary module's line parses too; an NVML that raises falls back to /proc."""
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")

    def broken() -> str:
        raise RuntimeError("Uninitialized")

    assert host.facts(driver_version=broken, nvidia_proc=proc, cpuinfo=proc, os_release=proc).nvidia_driver == (
        "535.183.01")


def addrs(**table: list[str]) -> dict[str, list[SimpleNamespace]]:
    return {name: [SimpleNamespace(family=socket.AF_INET, address=a) for a in found] for name, found in table.items()}


def test_mgmt_interface_is_the_one_holding_the_address(caplog: pytest.LogCaptureFixture) -> None:
    """bond0 holds the address; loopback is lo; an address nobody holds is eth0 with a warning."""
    table = addrs(lo=["127.0.0.1"], bond0=["10.0.0.5"], ens3=["fe80::1%ens3", "00:11:22:33:44:55"])
    assert host.mgmt_interface("10.0.0.5", if_addrs=lambda: table) == "bond0"
    assert host.mgmt_interface("fe80::1", if_addrs=lambda: table) == "ens3"
    assert host.mgmt_interface("127.0.0.1", if_addrs=lambda: {}) == "lo"
    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery.host"):
        assert host.mgmt_interface("192.0.2.9", if_addrs=lambda: table) == "eth0"
    assert "192.0.2.9" in caplog.records[0].getMessage()
    assert host.mgmt_interface("127.0.0.1") == "lo"  # this machine's own table
