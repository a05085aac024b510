"""The router's tokenizers, one per ``kv_aware`` model, loaded once per model and tokenizer version.

Where the files come from: the control plane. The table names, for a ``kv_aware`` model whose source the
control plane can read (``hf://`` or ``mirror://``, through the cluster's hub or mirror as the deploy
preview reads metadata), the version of its tokenizer (``ModelRoute.tokenizer``: its source, with its
revision). A router fetches the files once per model and version (``Fetch``: ``GET
/api/v1/router/tokenizer/{model}`` with its router credential, ``usagehttp``; inside ``llmgw server`` the
control plane's reader, called in process) and keeps the ``ModelTokenizer`` built from them. Why not each
router from the hub itself: routers hold no hub token and may not reach the hub at all, and only the
control plane knows the model's source; why not the agent: it has the files only on the nodes that
fetched them, after placement, and a ``file://`` source only there (such a model's text requests fall
back, as before).

The cost is only ``kv_aware``'s: for any other routing nothing here is called (``completions`` asks only
for routes in ``policies.TOKENED``); for a ``kv_aware`` model whose table entry names no tokenizer, one
attribute read. A fetch runs in the background: until it is done (or after it failed, for ``RETRY_S``),
requests fall back to ``prefix_cache``, never wait. Tokenizing a long prompt goes to a worker thread
(``INLINE_CHARS``: below it, inline is cheaper than the hop; ``bench/kv_tokenize.py`` measures both), through
``encode_batch``, which releases the GIL while it works (``encode`` holds it: the loop would stall all the same).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from llmgw.router import tokenizer as rtok

log = logging.getLogger(__name__)

#: The most a model's tokenizer files may weigh together (Gemma 3's tokenizer.json, among the largest, is 33 MB).
MAX_BYTES = 64 << 20
#: A fetch that failed is tried again after this long; meanwhile the model's requests fall back.
RETRY_S = 60.0
#: Prompt text (characters) tokenized on the event loop; longer goes to a worker thread (and releases the GIL
#: there): about 250 tokens, 0.1-0.3 ms, where the hop to a thread costs about 0.2 ms (bench/kv_tokenize.py).
INLINE_CHARS = 1024


@dataclasses.dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """A model's tokenizer files as the control plane sends them; ``version``: what the table named."""

    version: str
    tokenizer_json: bytes
    tokenizer_config: bytes | None = None
    chat_template: str | None = None

    @property
    def size(self) -> int:
        return (len(self.tokenizer_json) + len(self.tokenizer_config or b"")
                + len((self.chat_template or "").encode()))

    def to_doc(self) -> dict[str, Any]:
        return {"version": self.version, "tokenizer_json": self.tokenizer_json.decode("utf-8"),
                "tokenizer_config": self.tokenizer_config.decode("utf-8") if self.tokenizer_config else None,
                "chat_template": self.chat_template}

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any]) -> TokenizerFiles:
        """The REST answer's document; ``ValueError`` naming the field when it is not one."""
        if not isinstance(doc, Mapping):
            raise ValueError("the tokenizer document is not a JSON object")
        tj, cfg, tmpl, version = (doc.get("tokenizer_json"), doc.get("tokenizer_config"), doc.get("chat_template"),
                                  doc.get("version"))
        if not isinstance(tj, str) or not isinstance(version, str):
            raise ValueError("the tokenizer document lacks tokenizer_json or version (strings)")
        if cfg is not None and not isinstance(cfg, str) or tmpl is not None and not isinstance(tmpl, str):
            raise ValueError("the tokenizer document's tokenizer_config and chat_template must be strings or null")
        return cls(version, tj.encode("utf-8"), cfg.encode("utf-8") if cfg is not None else None, tmpl)


#: A model's name -> its tokenizer files (raises on failure, with a sentence saying why).
Fetch = Callable[[str], Awaitable[TokenizerFiles]]


class Tokenizers:
    """Model name -> (version, ``ModelTokenizer``), loaded in the background as ``kv_aware`` requests ask."""

    def __init__(self, fetch: Fetch | None, *, retry_s: float = RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch, self._retry_s, self._clock = fetch, retry_s, clock
        self._loaded: dict[str, tuple[str, rtok.ModelTokenizer | None]] = {}
        self._failed_at: dict[tuple[str, str], float] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def get(self, model: str, version: str) -> rtok.ModelTokenizer | None:
        """The model's tokenizer at ``version`` if loaded; else None, and its load started (on the loop)."""
        if not version or self._fetch is None:
            return None
        held = self._loaded.get(model)
        if held is not None and held[0] == version:
            return held[1]
        if model not in self._tasks:
            failed = self._failed_at.get((model, version))
            if failed is None or self._clock() - failed >= self._retry_s:
                self._tasks[model] = asyncio.get_running_loop().create_task(self._load(model, version))
        return None

    async def _load(self, model: str, version: str) -> None:
        assert self._fetch is not None
        try:
            files = await self._fetch(model)
            if files.size > MAX_BYTES:
                raise ValueError(f"its tokenizer files weigh {files.size} bytes, more than {MAX_BYTES}")
            if files.version != version:
                log.info("kv_aware: %s's tokenizer is at %s, not %s yet; using it", model, files.version, version)
            built = await asyncio.to_thread(rtok.ModelTokenizer, files.tokenizer_json, files.tokenizer_config,
                                            files.chat_template)
        except rtok.TokenizerRefused as exc:
            log.warning("kv_aware: %s's tokenizer cannot be matched to vLLM's (%s); its text requests fall back to "
                        "prefix_cache", model, exc)
            self._loaded[model] = (version, None)
        except Exception as exc:  # the control plane, the network, a bad document: tried again later
            self._failed_at[(model, version)] = self._clock()
            log.warning("kv_aware: cannot load %s's tokenizer (%s); its text requests fall back to prefix_cache, "
                        "tried again in %.0f s", model, exc, self._retry_s)
        else:
            self._loaded[model] = (version, built)
            log.info("kv_aware: %s's tokenizer loaded (%s)", model, version)
        finally:
            self._tasks.pop(model, None)

    async def wait(self) -> None:
        """Until every load started has ended (tests, and a clean shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)


async def prompt_ids(tokenizer: rtok.ModelTokenizer, path: str, doc: Mapping[str, Any]) -> tuple[int, ...] | None:
    """``tokenizer.ids_for``, in a worker thread when the request's text is long (the event loop stays free)."""
    if _text_chars(doc) <= INLINE_CHARS:
        return rtok.ids_for(tokenizer, path, doc)
    return await asyncio.to_thread(functools.partial(rtok.ids_for, tokenizer, path, doc, release_gil=True))


def _text_chars(doc: Mapping[str, Any]) -> int:
    prompt = doc.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    messages = doc.get("messages")
    total = 0
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, Mapping) else None
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(len(t) for p in content if isinstance(p, Mapping) and isinstance(t := p.get("text"), str))
    return total
