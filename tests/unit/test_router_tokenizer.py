"""``router.tokenizer`` against the ids vLLM 0.32's own loader computed (tests/fixtures/kvtok/generate.py).

Two tokenizers (the tiny Llama's byte-level BPE, SmolLM2's from its GGUF) in five variants (BOS in the
post-processor, ``add_bos_token``/``add_eos_token`` in the config, a template writing ``bos_token``),
each with completion prompts (with and without special tokens) and chats.
"""

from __future__ import annotations

import json
import lzma
import pathlib

import pytest

from llmgw.router import tokenizer as rtok

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures/kvtok"
CASES = json.loads((FIXTURES / "cases.json").read_text())
VARIANTS = {v["name"]: v for v in CASES["variants"]}


def _tokenizer_json(name: str) -> bytes:
    raw = (FIXTURES / name).read_bytes()
    return lzma.decompress(raw) if name.endswith(".xz") else raw


def load(variant: dict) -> rtok.ModelTokenizer:
    doc = json.loads(_tokenizer_json(variant["tokenizer"]))
    if variant["post_processor"] is not None:
        doc["post_processor"] = variant["post_processor"]
    return rtok.ModelTokenizer(json.dumps(doc).encode(), json.dumps(variant["tokenizer_config"]).encode(),
                               variant["chat_template"])


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> tuple[dict, rtok.ModelTokenizer]:
    v = VARIANTS[request.param]
    return v, load(v)


def test_fixtures_come_from_vllm_0_32_and_cover_bos_cases() -> None:
    assert CASES["vllm"] == "0.32.0"
    assert {"tiny", "tiny-add-bos", "tiny-llama3", "smollm2", "smollm2-add-bos-eos"} <= VARIANTS.keys()
    llama3 = VARIANTS["tiny-llama3"]
    bos = next(c for c in llama3["completions"] if c["prompt"] == "Hello world" and c["add_special_tokens"])
    assert bos["ids"][0] == 0  # BOS from tokenizer.json's post-processor: the case must exercise it
    assert llama3["chats"][0]["ids"][0] == 0 and llama3["chats"][0]["ids"][1] != 0  # the template's, once


def test_completion_prompts_tokenize_as_vllm(variant: tuple[dict, rtok.ModelTokenizer]) -> None:
    v, tok = variant
    for case in v["completions"]:
        body = {"prompt": case["prompt"]}
        if not case["add_special_tokens"]:
            body["add_special_tokens"] = False
        assert tok.completion_ids(body) == tuple(case["ids"]), (v["name"], case["prompt"], case["add_special_tokens"])
        assert tok.completion_ids(body, release_gil=True) == tuple(case["ids"])  # encode_batch: the same ids


def test_chats_tokenize_as_vllm(variant: tuple[dict, rtok.ModelTokenizer]) -> None:
    v, tok = variant
    for case in v["chats"]:
        assert tok.chat is not None and tok.chat.render(
            [{"role": m["role"], "content": rtok._text(m["content"])} for m in case["messages"]]) == case["text"]
        assert tok.chat_ids({"model": "m", "messages": case["messages"]}) == tuple(case["ids"]), (v["name"], case)
        assert rtok.ids_for(tok, "/v1/chat/completions", {"messages": case["messages"]}) == tuple(case["ids"])
        assert rtok.ids_for(tok, "/v1/chat/completions", {"messages": case["messages"]},
                            release_gil=True) == tuple(case["ids"])


def test_a_batch_is_keyed_by_its_first_prompt() -> None:
    tok = load(VARIANTS["tiny"])
    first = VARIANTS["tiny"]["completions"][0]
    assert first["add_special_tokens"]
    assert tok.completion_ids({"prompt": [first["prompt"], "something else"]}) == tuple(first["ids"])
    assert rtok.ids_for(tok, "/v1/completions", {"prompt": first["prompt"]}) == tuple(first["ids"])


@pytest.mark.parametrize("change", [
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"chat_template": "{{ messages }}"},
    {"chat_template_kwargs": {"enable_thinking": True}},
    {"continue_final_message": True},
    {"add_generation_prompt": False},
    {"add_special_tokens": True},
    {"documents": [{"title": "t", "text": "x"}]},
    {"reasoning_effort": "low"},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
    {"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]},
    {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]},
    {"messages": [{"role": "developer", "content": "be brief"}]},
    {"messages": []},
])
def test_what_is_not_mimicked_falls_back(change: dict) -> None:
    tok = load(VARIANTS["tiny"])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **change}
    assert tok.chat_ids(body) is None


def test_completion_fallbacks() -> None:
    tok = load(VARIANTS["tiny"])
    assert tok.completion_ids({"prompt": [1, 2, 3]}) is None  # ids already: not this module's job
    assert tok.completion_ids({"prompt": "x", "suffix": "y"}) is None
    assert tok.completion_ids({"prompt": "x", "add_special_tokens": "yes"}) is None
    assert rtok.ids_for(tok, "/v1/embeddings", {"input": "x"}) is None


def test_a_tokenizer_class_transformers_rebuilds_is_refused_naming_it() -> None:
    v = VARIANTS["tiny"]
    with pytest.raises(rtok.TokenizerRefused, match="LlamaTokenizer"):
        rtok.ModelTokenizer(_tokenizer_json(v["tokenizer"]), json.dumps({"tokenizer_class": "LlamaTokenizer"}).encode())
    with pytest.raises(rtok.TokenizerRefused, match="tokenizer.json does not load"):
        rtok.ModelTokenizer(b'{"not": "a tokenizer"}')


def test_a_template_looping_over_content_falls_back() -> None:
    v = VARIANTS["tiny"]
    loops = "{% for m in messages %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endfor %}"
    tok = rtok.ModelTokenizer(_tokenizer_json(v["tokenizer"]), None, loops)
    assert tok.chat is not None and tok.chat.content_format == "openai"
    assert tok.chat_ids({"messages": [{"role": "user", "content": "hi"}]}) is None


def test_the_chat_template_comes_from_the_file_first_then_the_config() -> None:
    assert rtok.chat_template_of({"chat_template": "A"}, "B") == "B"
    assert rtok.chat_template_of({"chat_template": "A"}, None) == "A"
    assert rtok.chat_template_of({"chat_template": [{"name": "tool_use", "template": "T"},
                                                    {"name": "default", "template": "D"}]}, None) == "D"
    assert rtok.chat_template_of({}, None) is None
