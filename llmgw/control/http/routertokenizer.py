"""``GET /api/v1/router/tokenizer/{model}``: a ``kv_aware`` model's tokenizer files, for routers (issue 31).

A router tokenizes a text prompt with them so ``kv_aware`` can hash it as the engine does
(``router.tokenizers``); ``control.tokenizerfiles`` reads them from the model's source through the cluster's
hub or mirror and says which files and why none. A router's credential reaches this (``auth.principals``),
as a user's does: the files are the model's public ones. The version the table names
(``ModelEntry.tokenizer``) is the answer's ``version``.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter

from llmgw.control.cluster import Cluster
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound
from llmgw.control.store.offloop import StoreThread
from llmgw.control.tokenizerfiles import NoTokenizer

PATH = "/api/v1/router/tokenizer/{model}"


class TokenizerDoc(schemas.Body):
    version: str = pydantic.Field(description="The model's source, as the table's `tokenizer` names it")
    tokenizer_json: str = pydantic.Field(description="tokenizer.json, as the source holds it")
    tokenizer_config: str | None = pydantic.Field(description="tokenizer_config.json; null: the source has none")
    chat_template: str | None = pydantic.Field(description="chat_template.jinja; null: the source has none")


def router(db: StoreThread, cluster: Cluster) -> APIRouter:
    api = APIRouter()

    @api.get(PATH, response_model=TokenizerDoc,
             responses={404: {"description": "No such model, or it offers no tokenizer (not kv_aware, a source "
                                             "the control plane cannot read, no tokenizer.json): the sentence says"}})
    async def router_tokenizer(model: str) -> dict[str, Any]:
        """A kv_aware model's tokenizer files, read from its source through the cluster's hub or mirror."""
        if cluster.tokenizer_files is None:
            raise NotFound("tokenizer", model, "this control plane reads no model sources", code="no_tokenizer")
        try:
            files = await cluster.tokenizer_files.for_model(db, model)
        except NoTokenizer as exc:
            raise NotFound.said(str(exc), code="no_tokenizer") from None
        return files.to_doc()

    return api
