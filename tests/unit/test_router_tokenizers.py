"""``router.tokenizers``: one load per model and version, in the background; failures retried later, refusals kept."""

from __future__ import annotations

import asyncio
import json
import pathlib

from llmgw.api import routing
from llmgw.router import tokenizers

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures/kvtok"
TOKENIZER_JSON = (FIXTURES / "tiny/tokenizer.json").read_bytes()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loaded_once_per_version_and_retried_only_after_a_failure_ages() -> None:
    async def main() -> None:
        calls: list[str] = []
        fail = [True]

        async def fetch(model: str) -> tokenizers.TokenizerFiles:
            calls.append(model)
            if fail[0]:
                raise ConnectionError("control plane away")
            return tokenizers.TokenizerFiles("v1", TOKENIZER_JSON, b"{}", None)

        clock = Clock()
        cache = tokenizers.Tokenizers(fetch, retry_s=60, clock=clock)
        assert cache.get("m", "") is None and calls == []  # no version offered: never fetched
        assert cache.get("m", "v1") is None
        await cache.wait()
        assert calls == ["m"]
        assert cache.get("m", "v1") is None  # failed: not again before retry_s
        await cache.wait()
        assert calls == ["m"]
        clock.now, fail[0] = 61.0, False
        assert cache.get("m", "v1") is None
        await cache.wait()
        found = cache.get("m", "v1")
        assert found is not None and found.completion_ids({"prompt": "Hello world"}) == (445, 310)
        assert found.chat is None and found.chat_refused == "the model has no chat template"
        assert calls == ["m", "m"]
        assert cache.get("m", "v2") is found or cache.get("m", "v2") is None  # the old one until v2 loads
        await cache.wait()
        assert calls == ["m", "m", "m"]
        await cache.close()

    asyncio.run(main())


def test_a_refused_tokenizer_is_remembered_and_never_fetched_again_for_that_version() -> None:
    async def main() -> None:
        calls: list[str] = []

        async def fetch(model: str) -> tokenizers.TokenizerFiles:
            calls.append(model)
            return tokenizers.TokenizerFiles("v1", TOKENIZER_JSON, json.dumps({"tokenizer_class": "LlamaTokenizer"})
                                             .encode(), None)

        cache = tokenizers.Tokenizers(fetch)
        cache.get("m", "v1")
        await cache.wait()
        assert cache.get("m", "v1") is None
        await cache.wait()
        assert calls == ["m"]

    asyncio.run(main())


def test_the_document_round_trips_and_a_bad_one_is_refused_naming_the_field() -> None:
    files = tokenizers.TokenizerFiles("hf://a/b@c", TOKENIZER_JSON, b'{"x": 1}', "{{ messages }}")
    assert tokenizers.TokenizerFiles.from_doc(json.loads(json.dumps(files.to_doc()))) == files
    for bad in ({}, {"version": "v", "tokenizer_json": 3},
                {"version": "v", "tokenizer_json": "{}", "chat_template": 1}):
        try:
            tokenizers.TokenizerFiles.from_doc(bad)
        except ValueError as exc:
            assert "tokenizer" in str(exc) or "chat_template" in str(exc)
        else:
            raise AssertionError(f"accepted {bad}")


def test_the_table_carries_the_tokenizer_version_and_an_old_table_has_none() -> None:
    entry = routing.ModelEntry(name="m", routing="kv_aware", tokenizer="hf://a/b@c")
    assert routing.read_model("m", entry.to_doc()).tokenizer == "hf://a/b@c"
    assert "tokenizer" not in routing.ModelEntry(name="m").to_doc()
    assert routing.read_model("m", {"name": "m", "tokenizer": 5}).tokenizer == ""


def test_long_text_is_measured_for_the_worker_thread() -> None:
    assert tokenizers._text_chars({"prompt": "abc"}) == 3
    assert tokenizers._text_chars({"messages": [{"content": "ab"}, {"content": [{"text": "cd"}, {"text": 5}]}]}) == 4


def test_a_long_prompt_is_tokenized_in_a_worker_thread_to_the_same_ids() -> None:
    from llmgw.router import tokenizer as rtok

    tok = rtok.ModelTokenizer(TOKENIZER_JSON, b"{}", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    long = "the quick brown fox " * (tokenizers.INLINE_CHARS // 10)
    assert len(long) > tokenizers.INLINE_CHARS
    for path, doc in (("/v1/completions", {"prompt": long}),
                      ("/v1/chat/completions", {"messages": [{"role": "user", "content": long}]})):
        expected = rtok.ids_for(tok, path, doc)
        assert expected and asyncio.run(tokenizers.prompt_ids(tok, path, doc)) == expected
