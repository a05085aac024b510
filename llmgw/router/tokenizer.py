"""A model's prompt token ids, computed in the router exactly as vLLM 0.32 computes them, for ``kv_aware``.

``kv_aware`` hashes a prompt's token ids as the engine does (``core.kvhash``); a request sent as text
has none, so the router tokenizes it with the model's own files (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``), through the HF ``tokenizers`` library (Rust, the same
library vLLM's ``transformers`` tokenizer wraps) and ``chattemplate`` (jinja2's immutable sandbox). Never
``transformers`` itself: it would pull torch-sized dependencies into the router.

What vLLM 0.32 computes (``vllm/renderers/base.py`` ``_tokenize_prompt``, ``renderers/hf.py``;
transformers 5.19's ``TokenizersBackend``, the class vLLM's ``get_tokenizer`` builds for these files):

* ``/v1/completions`` with a string prompt: ``tokenizer(prompt, add_special_tokens=A)["input_ids"]``
  with ``A`` the request's ``add_special_tokens`` (vLLM's extra field, default True): what
  ``tokenizer.json``'s post-processor adds (BOS for Llama 3's) is added. ``tokenizer_config.json``'s
  ``add_bos_token``/``add_eos_token`` change nothing under transformers 5.19 for these classes (the
  fixtures hold a case of each); special tokens written in the text (``<|im_start|>``) are matched as such;
* ``/v1/chat/completions``: the chat template rendered (``chattemplate``), then tokenized with
  ``add_special_tokens=False`` (the chat request's default: the template writes BOS itself).

A request this cannot match exactly gets no ids, and ``kv_aware`` falls back to ``prefix_cache`` for
it (a debug log says why): tools, ``chat_template``/``chat_template_kwargs``, ``continue_final_message``,
``add_generation_prompt: false``, ``documents``, ``reasoning_effort``, a content part that is not text, a
message with tool calls or a tool/developer role, a template that loops over message content. A
tokenizer whose ``tokenizer_class`` transformers rebuilds from its vocabulary (``LlamaTokenizer`` does,
with other pre-tokenization) is refused whole: only the classes that load ``tokenizer.json`` as it is.
``tests/fixtures/kvtok`` holds the ids vLLM's own loader computes; ``tests/unit/test_router_tokenizer.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers

from llmgw.router import chattemplate

log = logging.getLogger(__name__)

#: ``tokenizer_class`` values whose transformers class loads ``tokenizer.json`` unchanged (the generic backend).
PLAIN_CLASSES = frozenset({"", "TokenizersBackend", "PreTrainedTokenizerFast"})
#: A chat request's fields that change what vLLM renders in ways not mimicked here: such a request falls back.
_CHAT_FALLBACK_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "documents", "reasoning_effort",
                         "mm_processor_kwargs", "prompt_embeds")
_COMPLETION_FALLBACK_FIELDS = ("prompt_embeds", "truncate_prompt_tokens", "suffix")


class TokenizerRefused(ValueError):
    """The model's tokenizer files cannot be matched to vLLM's tokenization here; the message says why."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def chat_template_of(config: Mapping[str, Any], template_file: str | None) -> str | None:
    """The template transformers loads: ``chat_template.jinja`` first, else the config's (its "default" of a list)."""
    if template_file is not None:
        return template_file
    inline = config.get("chat_template")
    if isinstance(inline, str):
        return inline
    if isinstance(inline, list):
        for entry in inline:
            if isinstance(entry, Mapping) and entry.get("name") == "default" and isinstance(entry.get("template"), str):
                return entry["template"]
    return None


class ModelTokenizer:
    """One model's tokenizer and chat template; ``completion_ids``/``chat_ids`` answer None to fall back."""

    def __init__(self, tokenizer_json: bytes, tokenizer_config: bytes | None = None,
                 chat_template: str | None = None) -> None:
        try:
            config = json.loads(tokenizer_config) if tokenizer_config else {}
        except ValueError as exc:
            raise TokenizerRefused(f"tokenizer_config.json is not JSON: {exc}") from exc
        if not isinstance(config, dict):
            raise TokenizerRefused("tokenizer_config.json is not a JSON object")
        cls = config.get("tokenizer_class") or ""
        if cls not in PLAIN_CLASSES:
            raise TokenizerRefused(f"tokenizer_class {cls!r} is rebuilt by transformers from its vocabulary, so its "
                                   f"ids may differ from tokenizer.json's; kv_aware tokenizes only "
                                   f"{', '.join(sorted(PLAIN_CLASSES - {''}))}")
        if config.get("backend", "tokenizers") != "tokenizers":
            raise TokenizerRefused(f"tokenizer backend {config.get('backend')!r} is not the tokenizers library's")
        try:
            tok = tokenizers.Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        except Exception as exc:  # the Rust library's own exception type
            raise TokenizerRefused(f"tokenizer.json does not load: {exc}") from exc
        tok.no_truncation()
        tok.no_padding()
        tok.encode_special_tokens = bool(config.get("split_special_tokens", False))
        special = {name: text for name in chattemplate.SPECIAL_TOKEN_NAMES
                   if (text := _token_text(config.get(name))) is not None}
        # As transformers does: tokens the config names (added_tokens_decoder, the special ones) join the vocabulary.
        known = {t.content for t in tok.get_added_tokens_decoder().values()}
        extra = []
        decoder = config.get("added_tokens_decoder")
        for entry in (decoder.values() if isinstance(decoder, Mapping) else ()):
            text = _token_text(entry)
            if text is not None and text not in known and isinstance(entry, Mapping):
                extra.append(tokenizers.AddedToken(text, special=bool(entry.get("special", True)),
                                                   normalized=bool(entry.get("normalized", False)),
                                                   lstrip=bool(entry.get("lstrip", False)),
                                                   rstrip=bool(entry.get("rstrip", False)),
                                                   single_word=bool(entry.get("single_word", False))))
                known.add(text)
        extra += [tokenizers.AddedToken(t, special=True, normalized=False) for t in special.values() if t not in known]
        tok.add_special_tokens([t for t in extra if t.special])
        tok.add_tokens([t for t in extra if not t.special])
        self._tok = tok
        source = chat_template_of(config, chat_template)
        self.chat: chattemplate.ChatTemplate | None = None
        #: Why chats fall back for this model, when its template is missing or refused ("": it has one).
        self.chat_refused = "the model has no chat template" if source is None else ""
        if source is not None:
            try:
                self.chat = chattemplate.ChatTemplate(source, special)
            except chattemplate.TemplateRefused as exc:
                self.chat_refused = str(exc)
                log.warning("kv_aware: %s; its chat requests fall back to prefix_cache", exc)

    def encode(self, text: str, *, add_special_tokens: bool, release_gil: bool = False) -> tuple[int, ...]:
        """``text``'s ids; ``release_gil``: through ``encode_batch``, which lets the event loop's thread run
        meanwhile (``encode`` holds the GIL for its whole call: measured, bench/README.md), for a worker thread."""
        if release_gil:
            return tuple(self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)
        return tuple(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def completion_ids(self, doc: Mapping[str, Any], *, release_gil: bool = False) -> tuple[int, ...] | None:
        """A ``/v1/completions`` body's prompt ids (a batch's first prompt), or None to fall back."""
        prompt = doc.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or any(doc.get(f) is not None for f in _COMPLETION_FALLBACK_FIELDS):
            return None
        add = doc.get("add_special_tokens", True)
        return self.encode(prompt, add_special_tokens=add, release_gil=release_gil) if isinstance(add, bool) else None

    def chat_ids(self, doc: Mapping[str, Any], *, release_gil: bool = False) -> tuple[int, ...] | None:
        """A ``/v1/chat/completions`` body's prompt ids, or None to fall back (a debug log says why)."""
        why = self._chat_refusal(doc)
        if why is None:
            assert self.chat is not None  # _chat_refusal checked it
            messages = [_message(m) for m in doc["messages"]]
            text = self.chat.render(messages)
            if text is not None:
                return self.encode(text, add_special_tokens=False, release_gil=release_gil)
            why = "its chat template did not render it (see the debug log above)"
        log.debug("kv_aware falls back to prefix_cache for a chat request: %s", why)
        return None

    def _chat_refusal(self, doc: Mapping[str, Any]) -> str | None:
        if self.chat is None:
            return self.chat_refused
        if self.chat.content_format != "string":
            return f"its chat template's content format is {self.chat.content_format!r}, not mimicked here"
        present = [f for f in _CHAT_FALLBACK_FIELDS if doc.get(f) not in (None, [], {})]
        if present:
            return f"it sets {', '.join(present)}"
        if doc.get("continue_final_message") or doc.get("add_generation_prompt", True) is not True \
                or doc.get("add_special_tokens", False) is not False:
            return "it sets continue_final_message, add_generation_prompt or add_special_tokens"
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            return "it has no messages list"
        for m in messages:
            if not isinstance(m, Mapping) or m.get("role") not in ("system", "user", "assistant"):
                return "a message's role is not system, user or assistant"
            if m.get("tool_calls") or m.get("reasoning") is not None or _text(m.get("content")) is None:
                return "a message has tool calls, reasoning or content other than text"
            if "name" in m and not isinstance(m["name"], str):
                return "a message's name is not a string"
        return None


def _text(content: Any) -> str | None:
    """A message's content as vLLM's "string" format passes it: a string, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    return None


def _message(m: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def ids_for(tokenizer: ModelTokenizer, path: str, doc: Mapping[str, Any], *,
            release_gil: bool = False) -> tuple[int, ...] | None:
    """The prompt ids of a request to ``path`` (a completion or a chat), or None to fall back."""
    if path.endswith("/chat/completions"):
        return tokenizer.chat_ids(doc, release_gil=release_gil)
    if path.endswith("/completions"):
        return tokenizer.completion_ids(doc, release_gil=release_gil)
    return None


__all__: Sequence[str] = ("ModelTokenizer", "TokenizerRefused", "ids_for", "chat_template_of", "PLAIN_CLASSES")
