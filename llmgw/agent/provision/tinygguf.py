"""A tiny random-weight llama model, written on the fly: the engine probe's model, and the tests'.

The agent's engine probe (``probe``) starts llama.cpp on it to see that an installed engine really
serves; end-to-end tests (through ``llmgw.testing.tiny_gguf``) load it to generate. Both need llama.cpp
to load a model and generate, not to say anything sensible. SmolLM2-135M (98 MB) took 0.4-0.6 s to
load on the 2-core test machine; this one is about 0.44 MB, loads in under 10 ms there, and needs
nothing downloaded. Its weights come from a seeded generator, so the same file (byte for byte) is
written every time and temperature-0 output is reproducible. It needs the ``gguf`` and ``numpy``
packages (the ``test`` extra): without them this module does not import, and the probe says so
instead of starting the engine.

The tokenizer is GPT-2 style byte-level BPE: the 256 byte tokens in GPT-2's
byte-to-unicode spelling (so any text tokenizes, falling back to bytes), a few
merges (llama.cpp refuses a BPE vocabulary whose ``merges`` list is empty or
absent), and the special tokens the default chat template and end-of-generation
detection look for.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

#: Model dimensions: small enough to load at once, large enough to be a real llama graph.
N_EMBD = 64
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 2
N_FF = 128
N_CTX = 512
SEED = 1234

#: Merged pairs, in GPT-2 spelling ("Ġ" is a space). Their results join the vocabulary.
_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("o", "k"), ("Ġt", "ok")]
#: Special tokens: end of text (EOS/BOS), and the chatml markers the default chat template uses.
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_tokens() -> list[str]:
    """GPT-2's reversible byte-to-unicode map, in byte order (what llama.cpp's BPE expects)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """The tokens, their types and the merges of the tiny model's tokenizer."""
    tokens = _byte_tokens() + [a + b for a, b in _MERGES]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += _SPECIALS
    types += [gguf.TokenType.CONTROL] * len(_SPECIALS)
    return tokens, [int(t) for t in types], [f"{a} {b}" for a, b in _MERGES]


def write_tiny_llama_gguf(path: Path) -> Path:
    """Write the tiny llama model to ``path`` (about 0.5 MB, deterministic) and return the path."""
    tokens, types, merges = vocabulary()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD
    rng = np.random.default_rng(SEED)

    def weight(*shape: int) -> np.ndarray:
        # Scaled by 1/sqrt(fan_in), like a freshly initialised network, so activations keep
        # their size through the layers instead of growing with each matmul.
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmgw-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eot = tokens.index("<|endoftext|>")
    writer.add_bos_token_id(eot)
    writer.add_eos_token_id(eot)
    writer.add_add_bos_token(False)

    # numpy shapes are (rows, cols), the reverse of ggml's ne order llama.cpp checks.
    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", weight(N_HEAD * head_dim, N_EMBD))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"{blk}.attn_v.weight", weight(N_HEAD_KV * head_dim, N_EMBD))
        writer.add_tensor(f"{blk}.attn_output.weight", weight(N_EMBD, N_HEAD * head_dim))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(N_EMBD, N_FF))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
