"""A tiny random-weight Llama in Hugging Face format, written on the fly, for tests of real vLLM.

vLLM loads a directory (config.json, safetensors, tokenizer files), not a
GGUF. The end-to-end tests need it to load, generate and answer chat
requests, not to say anything sensible, and nothing may be downloaded. So
this writes one: a Llama with hidden size 128, 2 layers and 4 heads of 32
(vLLM's CPU attention refuses a head_dim below 32), random weights from a
seeded generator, and a byte-level BPE tokenizer trained by ``tokenizers`` on
a few KB of text made here (477 tokens). 1.8 MB, written in about 6 s on the
2-core test machine; the same bytes every time.

It imports torch and transformers, which are in vLLM's own venv
(``.venv-vllm``, made by ``make test-engines``) and not in llmgw's, so run it
with that venv's python from the repository root, where ``-m`` finds llmgw
without installing it there::

    .venv-vllm/bin/python -m llmgw.testing.tiny_hf OUT_DIR

It imports nothing from llmgw, so the same works with ``PYTHONPATH`` set to
the repository root from any directory.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

SEED = 1234
HIDDEN = 128
LAYERS = 2
HEADS = 4
#: Head dim 32: vLLM's CPU attention backend refuses smaller heads.
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 256
VOCAB = 512
CONTEXT = 512

BOS, EOS, IM_START, IM_END = "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"
SPECIALS = [BOS, EOS, IM_START, IM_END]

#: ChatML, ending generation at <|im_end|>: /v1/chat/completions needs a chat template.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = ("the a model token engine replica node router request answer stream chat queue prefix cache "
          "serve ready drain stop start health metric say hi hello world one two three four five six seven "
          "eight nine ten quick brown fox jumps over lazy dog gpu cpu memory port host key value").split()


def training_text(*, seed: int = SEED, lines: int = 200) -> list[str]:
    """A few KB of English-like lines from a seeded generator: the tokenizer's training corpus."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
        out.append(" ".join(words).capitalize() + rng.choice(".?!"))
    return out


def build_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A GPT-2 style byte-level BPE (any text tokenizes, falling back to bytes) with ChatML specials."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                                pad_token=EOS, model_max_length=CONTEXT)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_tiny_llama(out_dir: Path) -> Path:
    """Write the tiny model into ``out_dir`` (made if missing; deterministic) and return it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in (EOS, IM_END)]
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM,
        max_position_embeddings=CONTEXT, bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_ids,
        tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    # Without its own generation config vLLM takes only config.json's first EOS and
    # a chat answer runs on to max_tokens past <|im_end|>.
    model.generation_config = transformers.GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                                            eos_token_id=eos_ids)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    # Weights as a node keeps them, readable by the engines' own users (safetensors writes 0600): the
    # agent's preflight refuses a model its engine's uid cannot read.
    for path in out_dir.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out_dir


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m llmgw.testing.tiny_hf OUT_DIR", file=sys.stderr)
        return 2
    print(write_tiny_llama(Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
