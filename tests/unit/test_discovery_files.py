"""Weights on disk, model directories' filesystems, fingerprints, and the host's facts and interface."""

from __future__ import annotations

import json
import logging
import math
import socket
import struct
from pathlib import Path
from types import SimpleNamespace

import gguf
import pytest

from llmgw.agent.discovery import files, host, weightmeta
from llmgw.core import estimate
from llmgw.core.inventory import ModelDir, WeightFile
from llmgw.testing import tiny_gguf
from llmgw.testing.models import smollm2_gguf

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


# -- what the weights say about their model ---------------------------------------------------
def safetensors_file(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real safetensors file: 8-byte header length, the JSON header, then the tensors' bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * {"BF16": 2, "F32": 4}[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"\0" * offset)


#: The language-model part of SmolLM2-135M's own config.json.
SMOL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
               "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
               "num_key_value_heads": 3, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
               "vocab_size": 49152, "rms_norm_eps": 1e-05}


def test_a_gguf_header_gives_the_model_shape_and_its_parameter_count(tmp_path: Path) -> None:
    """The tiny GGUF's dimensions come back as written, and its parameter count as gguf's own reader sums it."""
    path = tiny_gguf.write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    (w,) = files.scan_weights([tmp_path])
    reader = gguf.GGUFReader(path)
    params = sum(math.prod(int(d) for d in t.shape) for t in reader.tensors)
    assert params > 0
    assert w == WeightFile(str(path), path.stat().st_size, "gguf", params=params, layers=tiny_gguf.N_LAYER,
                           heads=tiny_gguf.N_HEAD, kv_heads=tiny_gguf.N_HEAD_KV,
                           head_dim=tiny_gguf.N_EMBD // tiny_gguf.N_HEAD, hidden_size=tiny_gguf.N_EMBD,
                           context_length=tiny_gguf.N_CTX)


def test_smollm2_gguf_metadata_and_its_memory_estimate(tmp_path: Path) -> None:
    """SmolLM2-135M: 30 layers, 9 heads (3 for keys/values) of 64, 8192 context; its estimate checks by hand."""
    link = tmp_path / "smol.gguf"
    link.symlink_to(smollm2_gguf())
    (w,) = files.scan_weights([tmp_path])
    # 134,515,008 is what gguf.GGUFReader sums from the same file's tensor shapes.
    assert (w.layers, w.heads, w.kv_heads, w.head_dim, w.hidden_size, w.context_length, w.params) == (
        30, 9, 3, 64, 576, 8192, 134_515_008)
    assert w.size_bytes == 98_362_432 and w.dtype_bytes == 0
    # 2 x 30 layers x 3 heads x 64 x 2 bytes = 23,040 bytes a token; x 4096 = 94,371,840.
    body = 98_362_432 + 94_371_840
    assert estimate.memory_bytes(w, 4096) == body + math.ceil(body / 10) + estimate.OVERHEAD_BYTES


def test_bad_gguf_files_are_listed_with_nothing_known_and_the_scan_goes_on(tmp_path: Path) -> None:
    """Truncated, foreign, empty and unknown-version files give zeros, never an exception; good files still read."""
    good = tiny_gguf.write_tiny_llama_gguf(tmp_path / "good.gguf")
    data = good.read_bytes()
    (tmp_path / "half.gguf").write_bytes(data[:200])  # cut inside the key/value section
    (tmp_path / "nokv.gguf").write_bytes(data[:20])
    (tmp_path / "html.gguf").write_bytes(b"<html>404 Not Found</html>")
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little") + data[8:])
    huge = bytearray(data)
    huge[16:24] = (1 << 40).to_bytes(8, "little")  # a key/value count no real file has
    (tmp_path / "huge.gguf").write_bytes(bytes(huge))
    found = {Path(w.path).name: w for w in files.scan_weights([tmp_path])}
    assert sorted(found) == ["empty.gguf", "good.gguf", "half.gguf", "html.gguf", "huge.gguf", "nokv.gguf",
                             "v9.gguf"]
    for name, w in found.items():
        if name != "good.gguf":
            assert (w.params, w.layers, w.kv_heads, w.head_dim, w.context_length) == (0, 0, 0, 0, 0), name
            assert estimate.memory_bytes(w, 1024) is None
    assert found["good.gguf"].layers == tiny_gguf.N_LAYER


def test_a_big_endian_gguf_header_reads_the_same() -> None:
    """The s390x byte order: the version reads byte-swapped, and every number after it is big-endian."""
    def s(text: str) -> bytes:
        return struct.pack(">Q", len(text)) + text.encode()

    kv = [(s("general.architecture"), 8, s("llama")), (s("llama.block_count"), 4, struct.pack(">I", 3)),
          (s("llama.attention.head_count_kv"), 9, struct.pack(">IQ", 4, 3) + struct.pack(">3I", 2, 4, 2))]
    header = b"GGUF" + struct.pack(">IQQ", 3, 1, len(kv)) + b"".join(k + struct.pack(">I", t) + v for k, t, v in kv)
    tensor = s("w") + struct.pack(">I", 2) + struct.pack(">QQ", 8, 5) + struct.pack(">IQ", 0, 0)
    # A per-layer head count (OpenELM) gives its largest: the cache is sized for the widest layer.
    assert weightmeta._parse_gguf(header + tensor) == {"params": 40, "layers": 3, "kv_heads": 4}


def test_safetensors_dir_metadata_comes_from_config_json_and_tensor_headers(tmp_path: Path) -> None:
    """Layers, heads, context and dtype from config.json; parameters summed over every file's tensor shapes."""
    model = tmp_path / "smol"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOL_CONFIG))
    safetensors_file(model / "model-00001-of-00002.safetensors",
                     {"embed": ("BF16", [49152, 576]), "norm": ("BF16", [576])})
    safetensors_file(model / "model-00002-of-00002.safetensors", {"layers.0.q": ("BF16", [576, 576])})
    (model / "tokenizer.json").write_text("{}")
    (w,) = files.scan_weights([tmp_path])
    size = sum(p.stat().st_size for p in model.iterdir())
    assert w == WeightFile(str(model), size, "safetensors", params=49152 * 576 + 576 + 576 * 576, layers=30,
                           heads=9, kv_heads=3, head_dim=64, hidden_size=576, context_length=8192, dtype_bytes=2)
    # KV in the model's dtype (vLLM's "auto"): 2 x 30 x 3 x 64 x 2 bytes x 1000 tokens.
    assert estimate.kv_bytes_per_token(w) == 23_040


def test_safetensors_configs_of_other_shapes(tmp_path: Path) -> None:
    """A nested text_config, an explicit head_dim, no KV heads (full attention) and a dtype only the tensors state."""
    nested = {"model_type": "gemma3", "text_config": {"num_hidden_layers": 4, "num_attention_heads": 8,
                                                      "num_key_value_heads": 4, "hidden_size": 640,
                                                      "head_dim": 256, "max_position_embeddings": 32768}}
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "config.json").write_text(json.dumps(nested))
    safetensors_file(tmp_path / "g" / "model.safetensors", {"w": ("F32", [10, 10])})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4,
                                                             "hidden_size": 64, "torch_dtype": "float32"}))
    safetensors_file(tmp_path / "m" / "model.safetensors", {"w": ("BF16", [3])})
    g, m = files.scan_weights([tmp_path])
    assert (g.layers, g.heads, g.kv_heads, g.head_dim, g.context_length, g.params, g.dtype_bytes) == (
        4, 8, 4, 256, 32768, 100, 4)
    assert (m.layers, m.heads, m.kv_heads, m.head_dim, m.context_length, m.dtype_bytes) == (2, 4, 4, 16, 0, 4)


def test_bad_safetensors_dirs_keep_what_can_be_read(tmp_path: Path) -> None:
    """A config.json that is not JSON loses the shape; a truncated tensor header loses only the parameter count."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text("{oops")
    safetensors_file(tmp_path / "a" / "model.safetensors", {"w": ("BF16", [4, 4])})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text(json.dumps(SMOL_CONFIG))
    safetensors_file(tmp_path / "b" / "model-1.safetensors", {"w": ("BF16", [4, 4])})
    (tmp_path / "b" / "model-2.safetensors").write_bytes((1 << 20).to_bytes(8, "little") + b'{"w": ')
    a, b = files.scan_weights([tmp_path])
    assert (a.params, a.layers, a.dtype_bytes, a.size_bytes > 0) == (16, 0, 2, True)
    assert (b.params, b.layers, b.kv_heads, b.dtype_bytes) == (0, 30, 3, 2)


def test_metadata_is_read_again_only_when_the_file_changes(tmp_path: Path) -> None:
    """An unchanged file is answered from the cache; one rewritten (a finished download) is parsed anew."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"partial download")
    assert files.scan_weights([tmp_path])[0].layers == 0
    tiny_gguf.write_tiny_llama_gguf(path)
    assert files.scan_weights([tmp_path])[0].layers == tiny_gguf.N_LAYER
    calls: list[int] = []
    assert weightmeta.cached(str(path), [str(path)], lambda: calls.append(1) or {"layers": 7})["layers"] == 2
    assert calls == []
