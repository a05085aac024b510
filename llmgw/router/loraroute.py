"""LoRA adapters an engine picks per request (llama.cpp): what the router adds to such a model's requests.

llama.cpp holds every adapter of its model from the start (``--lora FILE`` each, at scale 0) and applies
the ones a request names in its ``lora`` field, ``[{"id": N, "scale": S}]``, N the adapter's index in the
model's list (the order of its ``--lora`` flags). An adapter's route (``table.adapter_routes``) therefore
adds ``"lora":[{"id":N,"scale":S}]`` in front of the client's fields; ``model`` stays the adapter's name
(llama.cpp answers under the name asked for). A client may set the scale with ``lora_scale`` (the
OpenAI client's ``extra_body={"lora_scale": 0.5}``): a number from 0 (the base model's answer) to
``MAX_SCALE``; 1 when not given.

Every request of such a model, its base's too, also gets ``"cache_prompt":false``: llama.cpp reuses a
slot's cached prompt across requests with different adapters (measured on xllamacpp 2026.10: the same
greedy request answered differently after another adapter's ran in its slot), so with the cache on, an
answer would depend on the request before it.

On the other engines (vLLM, the sim, SGLang, which is asked for an adapter as ``model: "BASE:ADAPTER"``,
``table.adapter_routes``), an adapter runs at the scale it was trained with: ``lora_scale`` there is
refused with a sentence (``Lora.scalable`` False). A model without adapters has no ``Lora``
(``ModelRoute.lora`` None): its requests pay one attribute test.
"""

from __future__ import annotations

import dataclasses
import math

from llmgw.core import adapters as adapters_mod
from llmgw.router import errors
from llmgw.router.request import CompletionRequest

#: The request's field for an adapter's scale, and the largest scale taken.
SCALE_FIELD = "lora_scale"
MAX_SCALE = 4.0
_NO_CACHE = b'"cache_prompt":false,'


@dataclasses.dataclass(frozen=True, slots=True)
class Lora:
    """What a route of a model with adapters adds to a request: ``fields`` (JSON members, each ending in a
    comma) in front of the client's, and whether ``lora_scale`` is taken (with the adapter's id)."""

    fields: bytes
    #: The adapter's id in the engine (llama.cpp's index); -1: the base model's route, or a runtime engine's.
    id: int = -1
    #: The name a refusal gives the model.
    name: str = ""
    scalable: bool = False


def of_base(engine: str, name: str, adapters: tuple[str, ...]) -> Lora | None:
    """The base model's: llama.cpp with adapters gets its prompt cache off; None for the rest."""
    if not adapters or engine not in adapters_mod.BY_ID:
        return None
    return Lora(fields=_NO_CACHE, name=name)


def of_adapter(engine: str, name: str, index: int) -> Lora:
    """An adapter's: llama.cpp's names it by id (``index``); a runtime engine's adds nothing."""
    if engine not in adapters_mod.BY_ID:
        return Lora(fields=b"", name=name)
    return Lora(fields=_fields(index, 1.0), id=index, name=name, scalable=True)


def _fields(index: int, scale: float) -> bytes:
    return b'"lora":[{"id":%d,"scale":%s}],' % (index, repr(float(scale)).encode()) + _NO_CACHE


def apply(lora: Lora, req: CompletionRequest, body: bytes) -> bytes:
    """``body`` with ``lora.fields`` (at the asked scale) in front; ApiError for a ``lora_scale`` refused."""
    fields = lora.fields
    if SCALE_FIELD in req.doc:
        fields = _fields(lora.id, scale_of(lora, req.doc[SCALE_FIELD]))
    if not fields:
        return body
    start = len(body) - len(body.lstrip(b" \t\r\n"))
    if body[start:start + 1] != b"{" or body[start + 1:start + 2] == b"\x00":
        raise errors.invalid_request("A request for a LoRA adapter must be UTF-8 JSON; send it as UTF-8.")
    return body[:start + 1] + fields + body[start + 1:]


def scale_of(lora: Lora, value: object) -> float:
    """The ``lora_scale`` asked for, checked; ApiError naming the field and what to send instead."""
    if not lora.scalable:
        if lora.id < 0 and lora.fields:
            why = (f"model {lora.name!r} is a base model; lora_scale applies to one of its adapters (GET /v1/models "
                   "lists them, with this model as parent): ask for the adapter by name")
        else:
            why = (f"the engine of {lora.name!r} applies an adapter at the scale it was trained with (only "
                   "llama.cpp models take a scale per request); remove lora_scale")
        raise errors.invalid_request(f"lora_scale is not taken here: {why}.", param=SCALE_FIELD)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= MAX_SCALE:
        raise errors.invalid_request(f"lora_scale must be a number from 0 (the base model's answer) to {MAX_SCALE:g}, "
                                     f"not {str(value)[:40]}.", param=SCALE_FIELD)
    return float(value)
