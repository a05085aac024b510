"""Remote weights' metadata read through a real ``llmgw mirror``: sizes, config.json and headers, no file fetched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llmgw.control import remotemeta
from llmgw.control.placement import fit
from llmgw.control.state import NodeView
from llmgw.core import estimate, weightmeta
from llmgw.core.inventory import Inventory
from llmgw.core.specs import ModelSpec, Resources
from llmgw.core.units import format_bytes
from llmgw.testing import hfrepo, procs, tiny_gguf
from llmgw.testing import system as system_mod

pytestmark = pytest.mark.slow

GIB = 2**30
REPO = "org/smol"
#: SmolLM2-135M's shape: 30 layers, 9 heads of 64, 3 KV heads, bfloat16, 8192 context.
CONFIG = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30, "num_attention_heads": 9,
          "num_key_value_heads": 3, "hidden_size": 576, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]], *, data: int = 4096) -> bytes:
    """A .safetensors file: the 8-byte length, the JSON header, then ``data`` bytes standing for the tensors."""
    header = json.dumps({k: {"dtype": t, "shape": s, "data_offsets": [0, 0]} for k, (t, s) in tensors.items()})
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + os.urandom(data)


@contextlib.contextmanager
def running_mirror(tmp: Path, root: Path) -> Iterator[str]:
    """A ``llmgw mirror`` serving ``root`` on a free port; stopped by its pid whatever happens."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    with procs.Proc.start(argv, log_path=tmp / "mirror.log") as proc:
        url = f"http://127.0.0.1:{port}"
        proc.wait_http(url + "/healthz", timeout=30)
        yield url


def test_hf_metadata_through_the_mirror_estimates_memory_with_no_file_on_any_node(tmp_path: Path) -> None:
    """An hf:// model's size, shape and parameters come from the mirror; placement estimates its memory from them."""
    files = {
        "config.json": json.dumps(CONFIG).encode(),
        "tokenizer.json": b'{"version": "1.0"}',
        "model-00001-of-00002.safetensors": safetensors_bytes({"embed": ("BF16", [49152, 576])}, data=200_000),
        "model-00002-of-00002.safetensors": safetensors_bytes({"q": ("BF16", [576, 576]), "n": ("BF16", [576])}),
        "README.md": b"# not needed by an engine\n" * 100,
    }
    root = tmp_path / "mirror"
    hfrepo.write_repo(root, REPO, files)
    needed = sum(len(v) for k, v in files.items() if k != "README.md")
    with running_mirror(tmp_path, root) as url:
        reader = remotemeta.Reader(hub_endpoint=url, mirror_url=url)
        got = reader.read(f"hf://{REPO}")
        missing = reader.read("hf://org/absent")
    assert got.problem == "" and got.weight is not None, got
    w = got.weight
    assert (w.size_bytes, w.format, w.source) == (needed, "safetensors", f"hf://{REPO}")
    assert (w.layers, w.heads, w.kv_heads, w.head_dim, w.context_length, w.dtype_bytes) == (30, 9, 3, 64, 8192, 2)
    assert w.params == 49152 * 576 + 576 * 576 + 576
    # Unreadable: answered with the problem, never raised, never waited on.
    assert missing.weight is None and "HTTP 404" in missing.problem and "/api/models/org/absent" in missing.problem
    # Placement on a node that holds nothing of it estimates from what was read.
    spec = ModelSpec(engine="sim", served_name="m", source=f"hf://{REPO}", resources=Resources(0, 0))
    bare = NodeView("a", Inventory(cpu_count=8, memory_total_bytes=64 * GIB, memory_available_bytes=32 * GIB,
                                   engines=(("sim", "1"),)), connected=True, reported=True)
    out = fit.place("m", spec, [bare], remote={f"hf://{REPO}": got})
    assert isinstance(out, fit.Placed) and out.memory_estimated
    assert out.memory_bytes == estimate.memory_bytes(w, 0, tensor_parallel=1, gpu=False)
    assert needed < out.memory_bytes < 2 * GIB


def test_gguf_header_through_mirror_files_by_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mirror:// .gguf's header is read by Range, giving the numbers the agent reads from the same file on disk.

    The first Range is made 64 bytes here, so the header is read in growing Ranges, as a 150,000-token
    vocabulary past the first megabyte is.
    """
    root = tmp_path / "mirror"
    path = tiny_gguf.write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    hfrepo.write_files(root, "tiny", {"tiny.gguf": path.read_bytes()})
    monkeypatch.setattr(remotemeta, "_GGUF_FIRST", 64)
    with running_mirror(tmp_path, root) as url:
        got = remotemeta.Reader(mirror_url=url).read("mirror://tiny/tiny.gguf")
    assert got.weight is not None, got.problem
    with open(path, "rb") as f:
        on_disk = weightmeta.parse_gguf(f.read())
    assert got.weight.size_bytes == path.stat().st_size and got.weight.format == "gguf"
    assert {k: getattr(got.weight, k) for k in on_disk} == on_disk and on_disk["layers"] == tiny_gguf.N_LAYER


def test_get_weights_lists_each_nodes_weights_and_the_models_that_ask(tmp_path: Path) -> None:
    """GET /api/v1/weights and `llmgw get weights`: a node's weight with its size, not fetched, asked for by m."""
    s = system_mod.System(tmp_path, server_args=("--weights-gc-free-below", "5"))
    try:
        (tmp_path / "node1" / "weights").mkdir(parents=True)
        path = tiny_gguf.write_tiny_llama_gguf(tmp_path / "node1" / "weights" / "tiny.gguf")
        s.start_server()
        s.start_agent("node1")
        s.apply(system_mod.sim_model("m", replicas=0, source=f"file://{path}"))
        rows = procs.wait_for(lambda: s.get("/api/v1/weights")["items"] or None, timeout=30, what="weights")
        assert rows == [{"node": "node1", "path": str(path), "cache_name": "", "size_bytes": path.stat().st_size,
                         "format": "gguf", "source": "", "last_used_unix": 0, "fetched_by_llmgw": False,
                         "models": ["m"]}]
        out = subprocess.run([sys.executable, "-m", "llmgw", "get", "weights", "--url", s.url], capture_output=True,
                             text=True, timeout=60, env=s.cli_env())
        assert out.returncode == 0, out.stderr
        header, row = out.stdout.splitlines()  # piped: plain columns, whole values, however long the path
        assert header.split() == ["NODE", "NAME", "SIZE", "SOURCE", "LAST", "USED", "FETCHED", "MODELS"]
        assert row.split() == ["node1", str(path), *format_bytes(path.stat().st_size).split(), "-", "-", "no", "m"]
    finally:
        s.close()


def test_reads_start_off_the_loop_once_per_source_and_a_failure_is_retried_later(tmp_path: Path) -> None:
    """want() reads each remote source once in a thread and kicks; a failed read is read again only after retry_s."""
    root = tmp_path / "mirror"
    hfrepo.write_repo(root, REPO, {"config.json": json.dumps(CONFIG).encode(),
                                   "model.safetensors": safetensors_bytes({"w": ("BF16", [8, 8])})})
    now = [0.0]
    kicks: list[int] = []
    spec = ModelSpec(engine="sim", served_name="m", source=f"hf://{REPO}", resources=Resources(0, 0))
    absent = ModelSpec(engine="sim", served_name="m", source="hf://org/absent", resources=Resources(0, 0))

    async def run(url: str) -> None:
        reader = remotemeta.Reader(hub_endpoint=url, retry_s=60, clock=lambda: now[0],
                                   on_read=lambda: kicks.append(1))
        try:
            reader.want([spec, spec, absent])
            reader.want([spec])  # in flight: not a second read
            assert reader.known() == {}
            await procs_wait(lambda: len(reader.known()) == 2)
            assert len(kicks) == 2
            assert reader.known()[f"hf://{REPO}"].weight is not None
            assert reader.known()["hf://org/absent"].weight is None
            reader.want([spec, absent])  # both answered, the failure too recently: nothing read
            assert reader._tasks == {}
            now[0] = 61.0
            reader.want([spec, absent])  # the failure is read again, the success never
            assert list(reader._tasks) == ["hf://org/absent"]
            await procs_wait(lambda: not reader._tasks)
            assert len(kicks) == 3
        finally:
            await reader.close()

    with running_mirror(tmp_path, root) as url:
        asyncio.run(run(url))


async def procs_wait(cond: Callable[[], bool], *, timeout: float = 20.0) -> None:
    """Awaits ``cond()`` true, polling every 10 ms (reads run in threads and land on the loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)
