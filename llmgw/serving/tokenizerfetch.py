"""The in-process router's ``kv_aware`` tokenizer files: the control plane's reader, called directly (issue 31).

A standalone router fetches them with ``GET /api/v1/router/tokenizer/{model}`` (``router.usagehttp``);
inside ``llmgw server`` the same ``control.tokenizerfiles`` answer is awaited in process, no HTTP, no JSON.
"""

from __future__ import annotations

from llmgw.control.store.offloop import StoreThread
from llmgw.control.tokenizerfiles import TokenizerFiles as Reader
from llmgw.router import tokenizers


def in_process(reader: Reader | None, db: StoreThread) -> tokenizers.Fetch | None:
    """The router's ``Fetch`` over the control plane's reader; None without one (no model sources are read)."""
    if reader is None:
        return None
    found = reader

    async def fetch(model: str) -> tokenizers.TokenizerFiles:
        files = await found.for_model(db, model)
        return tokenizers.TokenizerFiles(files.version, files.tokenizer_json, files.tokenizer_config,
                                         files.chat_template)

    return fetch
