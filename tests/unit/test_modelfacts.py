"""The deploy preview's pure parts: a header's words (real GGUF files, real config.json shapes), the memory each
engine needs, the model file it would apply, and the catalog file."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from llmgw.control.catalog import entries
from llmgw.core import estimate, modelfacts, specs, weightmeta
from llmgw.core.errors import LlmgwError
from llmgw.core.inventory import WeightFile
from llmgw.testing import tiny_gguf

GIB, MIB = 1 << 30, 1 << 20

#: Meta-Llama-3.1-8B-Instruct's config.json, as the hub serves it (the keys the preview reads, and others).
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256}
#: Qwen2.5-Coder-7B-Instruct-AWQ's: quantised by AutoAWQ, stored float16.
QWEN_AWQ = {
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "max_position_embeddings": 32768,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "quantization_config": {"bits": 4, "group_size": 128, "modules_to_not_convert": None,
                            "quant_method": "awq", "version": "gemm", "zero_point": True},
    "torch_dtype": "float16", "vocab_size": 152064}
#: Gemma 3's multimodal shape: the language model's numbers under text_config, no top-level dtype.
GEMMA3 = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
          "text_config": {"head_dim": 256, "hidden_size": 2560, "num_attention_heads": 8, "num_hidden_layers": 34,
                          "num_key_value_heads": 4, "max_position_embeddings": 131072, "model_type": "gemma3_text"},
          "vision_config": {"hidden_size": 1152}}


def _gguf(path: Path, *, file_type: int) -> bytes:
    """A real GGUF written by llama.cpp's own writer, with ``file_type`` and one small tensor."""
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(2)
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_file_type(file_type)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_a_gguf_header_says_its_architecture_and_quantisation(tmp_path: Path) -> None:
    """The tiny llama (F32) and a Q4_K_M-typed file: architecture and file type read from the header's keys."""
    raw = tiny_gguf.write_tiny_llama_gguf(tmp_path / "tiny.gguf").read_bytes()
    values, params = weightmeta.gguf_values(raw)
    assert modelfacts.gguf_labels(values) == modelfacts.Labels("llama", "F32", "")
    assert weightmeta.gguf_numbers(values, params) == weightmeta.parse_gguf(raw)
    assert weightmeta.parse_gguf(raw)["layers"] == tiny_gguf.N_LAYER
    values, params = weightmeta.gguf_values(_gguf(tmp_path / "q.gguf", file_type=15))
    assert modelfacts.gguf_labels(values) == modelfacts.Labels("qwen2", "", "Q4_K_M")
    assert params == 32 * 64
    values, _ = weightmeta.gguf_values(_gguf(tmp_path / "u.gguf", file_type=99))
    assert modelfacts.gguf_labels(values).quantization == "type 99"  # a type newer than this table: said, not hidden


def test_config_json_shapes_give_their_words_and_numbers() -> None:
    assert modelfacts.config_labels(LLAMA_31_8B) == modelfacts.Labels("LlamaForCausalLM", "bfloat16", "")
    assert modelfacts.config_labels(QWEN_AWQ) == modelfacts.Labels("Qwen2ForCausalLM", "float16", "awq")
    # No dtype in config.json: the safetensors headers' main dtype stands for it.
    assert modelfacts.config_labels(GEMMA3, "BF16") == modelfacts.Labels("Gemma3ForConditionalGeneration", "BF16", "")
    n = weightmeta.config_numbers(LLAMA_31_8B)
    assert (n["layers"], n["heads"], n["kv_heads"], n["head_dim"], n["context_length"], n["dtype_bytes"]) == (
        32, 32, 8, 128, 131072, 2)
    g = weightmeta.config_numbers(GEMMA3)
    assert (g["layers"], g["kv_heads"], g["head_dim"]) == (34, 4, 256)


def test_a_safetensors_header_gives_the_parameter_count(tmp_path: Path) -> None:
    """A .safetensors file written as the format says (length, JSON header, tensor bytes at their offsets)."""
    a, b = np.ones((128, 64), dtype=np.float16), np.ones((64,), dtype=np.float16)
    header = {"__metadata__": {"format": "pt"},
              "embed.weight": {"dtype": "F16", "shape": [128, 64], "data_offsets": [0, a.nbytes]},
              "norm.weight": {"dtype": "F16", "shape": [64], "data_offsets": [a.nbytes, a.nbytes + b.nbytes]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + a.tobytes() + b.tobytes())
    data = path.read_bytes()
    n = weightmeta.safetensors_header_length(data[:8])
    assert weightmeta.safetensors_params(data[8:8 + n]) == (128 * 64 + 64, "F16")


def _llama8b() -> WeightFile:
    n = weightmeta.config_numbers(LLAMA_31_8B)
    return WeightFile(path="", size_bytes=16_060_522_240, format="safetensors", params=8_030_261_248, **n)


def test_memory_per_engine_is_weights_plus_kv_for_the_context_and_concurrency() -> None:
    """Llama 3.1 8B in bf16: 128 KiB of KV per token (2 x 32 layers x 8 heads x 128 x 2 bytes); 8k x 4 is 4 GiB."""
    w = _llama8b()
    vllm = modelfacts.memory_for(w, "vllm", context=8192, concurrency=4)
    assert (vllm.device, vllm.weights_bytes, vllm.kv_bytes) == ("gpu", w.size_bytes, 4 * GIB)
    body = w.size_bytes + 4 * GIB
    assert vllm.total_bytes == body + math.ceil(body / 10) + estimate.OVERHEAD_BYTES + estimate.CUDA_CONTEXT_BYTES
    # Twice the concurrency: twice the KV cache, the weights once.
    more = modelfacts.memory_for(w, "vllm", context=8192, concurrency=8)
    assert more.kv_bytes == 2 * vllm.kv_bytes and more.weights_bytes == vllm.weights_bytes
    # Context 0: the model's own (131072 tokens, 16 GiB for one sequence).
    assert modelfacts.memory_for(w, "sglang", context=0, concurrency=1).kv_bytes == 16 * GIB
    sim = modelfacts.memory_for(w, "sim", context=8192, concurrency=4)
    assert sim.device == "cpu" and sim.total_bytes == vllm.total_bytes - estimate.CUDA_CONTEXT_BYTES


def test_engines_by_format() -> None:
    assert modelfacts.engines_for("gguf") == ("llamacpp", "sim")
    assert modelfacts.engines_for("safetensors") == ("vllm", "sglang", "sim")
    assert modelfacts.engines_for("") == ("sim",)


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang", "sim"])
def test_the_model_file_a_preview_writes_is_one_apply_accepts(engine: str) -> None:
    doc = modelfacts.manifest("qwen", source="hf://Qwen/Qwen2.5-0.5B-Instruct", source_file="", engine=engine,
                              context=4096, concurrency=4, memory_bytes=3 * GIB + 1)
    model = specs.parse_manifest(doc)
    s = model.spec
    assert (model.name, s.engine, s.source, s.max_concurrency_per_replica) == (
        "qwen", engine, "hf://Qwen/Qwen2.5-0.5B-Instruct", 4)
    stated = s.resources.gpus.memory_bytes if engine in ("vllm", "sglang") else s.resources.memory_bytes
    assert stated == 3 * GIB + MIB  # rounded up to whole MiB: never below the estimate
    if engine == "llamacpp":  # one --ctx-size shared by the slots (estimate's note)
        assert s.engine_args == ("--ctx-size", "16384", "--parallel", "4") and s.context_length == 0
    else:
        assert s.context_length == 4096


def test_model_names_from_sources() -> None:
    assert modelfacts.model_name("hf://Qwen/Qwen2.5-0.5B-Instruct") == "qwen2.5-0.5b-instruct"
    assert modelfacts.model_name("hf://b/SmolLM2-GGUF/SmolLM2-135M-Q4_K_M.gguf") == "smollm2-135m-q4-k-m"
    assert modelfacts.model_name("file:///models/") == "models"
    assert modelfacts.model_name("hf://o/r@v1") == "r"
    assert all(specs.NAME_RE.match(modelfacts.model_name(s)) for s in ("hf://o/-_-", "mirror://A_B.gguf"))


def test_the_shipped_catalog_parses_and_each_source_is_one_a_model_file_takes() -> None:
    found = entries.load()
    assert 8 <= len(found) <= 15
    assert len({e.name for e in found}) == len(found)
    for e in found:
        assert e.license and e.size and e.engine in ("llamacpp", "vllm", "sglang"), e
        specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": e.name},
                              "spec": {"engine": e.engine, "served_name": e.name, "source": e.source}})


@pytest.mark.parametrize(("doc", "said"), [
    ({"models": [{"name": "a"}]}, "models[0]: name and source are required"),
    ({"models": [{"name": "a", "source": "ftp://x"}]}, "models[0].source"),
    ({"models": [{"name": "a", "source": "hf://o/r", "engine": "tgi"}]}, "models[0].engine: no engine 'tgi'"),
    ({"models": [{"name": "a", "source": "hf://o/r", "sizee": "1GB"}]}, "unknown field 'sizee'"),
    ([1, 2], "expected a mapping with `models:`"),
])
def test_a_bad_catalog_is_refused_naming_the_entry_and_field(doc: object, said: str) -> None:
    with pytest.raises(LlmgwError, match=None) as got:
        entries.parse(doc, "mine.yaml")
    assert said in str(got.value) and "mine.yaml" in str(got.value)


def test_an_operators_catalog_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("models:\n  - name: ours\n    source: mirror://ours-7b\n    engine: vllm\n")
    assert entries.load(path) == (entries.Entry("ours", "mirror://ours-7b", engine="vllm"),)
    with pytest.raises(LlmgwError, match="cannot read it"):
        entries.load(tmp_path / "absent.yaml")


def test_the_servers_catalog_setting_is_read_at_start_and_a_bad_one_stops_it(tmp_path: Path) -> None:
    """``llmgw server --catalog FILE``: its entries, checked before anything starts; none given: the shipped one."""
    from llmgw.serving import config
    from llmgw.serving.settings import ServerSettings

    assert config.config_of(ServerSettings(), {}, default_data_dir=tmp_path).catalog is None
    good = tmp_path / "ours.yaml"
    good.write_text("models:\n  - name: ours\n    source: hf://us/ours\n")
    made = config.config_of(ServerSettings(catalog=good), {}, default_data_dir=tmp_path)
    assert made.catalog == (entries.Entry("ours", "hf://us/ours"),)
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: ours\n")
    with pytest.raises(LlmgwError, match=r"bad.yaml: models\[0\]: name and source are required"):
        config.config_of(ServerSettings(catalog=bad), {}, default_data_dir=tmp_path)
