"""What a model's files say about it beyond the numbers placement uses: its architecture, dtype and quantisation,
and, from those, the memory each engine that can run it needs and the model file that would deploy it.

Pure: the callers read the headers (``llmgw.control.remotemeta`` over HTTP, an agent from disk) and give this
module the parsed values. Used by the deploy preview (``llmgw plan``, ``POST /api/v1/preview``, the UI's
"Deploy a model" page); the memory figures are ``llmgw.core.estimate``'s, the one formula placement uses too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from llmgw.core import estimate
from llmgw.core.inventory import WeightFile

#: GGUF's ``general.file_type`` (llama.cpp's ``llama_ftype``): how most tensors are stored.
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0",
}
#: The engines that load each weights format, preferred first. The sim engine loads nothing and runs anything.
ENGINES_BY_FORMAT = {"gguf": ("llamacpp",), "safetensors": ("vllm", "sglang")}
SIM = "sim"
#: Engines that serve from GPUs: their memory is per GPU and includes a CUDA context.
GPU_ENGINES = frozenset({"vllm", "sglang"})
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class Labels:
    """The words a header states (empty: not stated)."""

    architecture: str = ""
    #: The stored dtype ("bfloat16", "F32").
    dtype: str = ""
    #: "Q4_K_M" (GGUF), "awq", "gptq", "fp8" (config.json's quantization_config); "" for none.
    quantization: str = ""


def gguf_labels(values: dict[str, Any]) -> Labels:
    """A GGUF header's words, from ``weightmeta.gguf_values``."""
    arch = values.get("general.architecture")
    ftype = values.get("general.file_type")
    kind = GGUF_FILE_TYPES.get(ftype, f"type {ftype}") if isinstance(ftype, int) else ""
    float_kinds = ("F32", "F16", "BF16")
    return Labels(architecture=arch if isinstance(arch, str) else "",
                  dtype=kind if kind in float_kinds else "", quantization="" if kind in float_kinds else kind)


def config_labels(cfg: dict[str, Any], stored_dtype: str = "") -> Labels:
    """A Hugging Face ``config.json``'s words; ``stored_dtype``: the safetensors headers' main dtype."""
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else cfg.get("model_type", "")
    dtype = cfg.get("torch_dtype", cfg.get("dtype")) or stored_dtype
    quant = cfg.get("quantization_config")
    method = quant.get("quant_method", "") if isinstance(quant, dict) else ""
    return Labels(architecture=str(arch or ""), dtype=str(dtype or "").removeprefix("torch."),
                  quantization=str(method or ""))


def engines_for(fmt: str) -> tuple[str, ...]:
    """The engines that can load weights of ``fmt``, preferred first, then the sim engine (any format)."""
    return (*ENGINES_BY_FORMAT.get(fmt, ()), SIM)


@dataclasses.dataclass(frozen=True, slots=True)
class EngineMemory:
    engine: str
    #: "gpu" (per GPU, with a CUDA context) or "cpu" (host memory).
    device: str
    weights_bytes: int
    kv_bytes: int
    #: What one replica needs in all (``estimate.memory_bytes``); 0 when the metadata is not enough.
    total_bytes: int


def memory_for(weight: WeightFile, engine: str, *, context: int, concurrency: int) -> EngineMemory:
    """The memory ``engine`` needs for ``weight`` holding ``concurrency`` sequences of ``context`` tokens each.

    ``context`` 0 is the model's own. The sim engine loads nothing: its figure is what placement would estimate
    for it anyway (the formula does not know the engine), so the preview and the placement agree.
    """
    gpu = engine in GPU_ENGINES
    weights = estimate.weights_bytes(weight) or 0
    per_token = estimate.kv_bytes_per_token(weight) or 0
    ctx = context or weight.context_length
    total = estimate.memory_bytes(weight, ctx, parallel=concurrency, gpu=gpu) if ctx > 0 else None
    return EngineMemory(engine, "gpu" if gpu else "cpu", weights, per_token * ctx * concurrency, total or 0)


def model_name(source: str) -> str:
    """A model name from its source: the last part, lower-case, characters a name may hold ("smollm2-135m")."""
    tail = source.rstrip("/").rsplit("/", 1)[-1].split("@", 1)[0]
    tail = tail.removesuffix(".gguf")
    name = re.sub(r"[^a-z0-9.-]+", "-", tail.lower()).strip("-.")
    return name[:63].strip("-.") or "model"


def mib(n: int) -> str:
    """``n`` bytes as a whole number of MiB, rounded up: what a model file's ``memory`` takes."""
    return f"{math.ceil(n / _MIB)}MiB"


def manifest(name: str, *, source: str, source_file: str, engine: str, context: int, concurrency: int,
             memory_bytes: int, replicas: int = 1) -> dict[str, Any]:
    """The model file the preview would apply: the memory stated (the estimate for this context and concurrency),
    so the placement shown is the placement applied."""
    spec: dict[str, Any] = {"engine": engine, "served_name": name, "replicas": replicas}
    if source:
        spec["source"] = source
    if source_file:
        spec["source_file"] = source_file
    if context and engine != "llamacpp":
        spec["context_length"] = context
    if engine in GPU_ENGINES:
        spec["resources"] = {"gpus": {"count": 1, **({"memory": mib(memory_bytes)} if memory_bytes else {})}}
    elif memory_bytes:
        spec["resources"] = {"memory": mib(memory_bytes)}
    if concurrency > 1:
        spec["max_concurrency_per_replica"] = concurrency
    if engine == "llamacpp" and (context or concurrency > 1):
        # llama.cpp's unified KV cache shares --ctx-size among its slots (``estimate``).
        ctx = context * concurrency if context else 0
        spec["engine_args"] = [*(["--ctx-size", str(ctx)] if ctx else []), "--parallel", str(concurrency)]
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name}, "spec": spec}
