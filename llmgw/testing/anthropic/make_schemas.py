"""Write ``schemas.json``: JSON Schemas of Anthropic's Messages API answers, made from the ``anthropic`` SDK's types.

Anthropic publishes its API's shapes as the typed models of its official SDKs (generated from its OpenAPI
document, which is not public). This script turns the Python SDK's pydantic models into one JSON Schema 2020-12
document whose ``$defs`` hold the roots below (pydantic's ``model_json_schema``/``TypeAdapter.json_schema``), then
makes every object with properties closed (``additionalProperties: false``, where pydantic writes true): the SDK's
models accept unknown fields, so without it a misspelt field of llmgw's would pass unseen. Run with the pinned SDK
installed:

    .venv/bin/python -m llmgw.testing.anthropic.make_schemas > llmgw/testing/anthropic/schemas.json

and update SOURCE.md's version line when the pin (pyproject.toml's test extra) moves.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: The root names in ``$defs``, and the SDK type each is made from.
ROOTS: dict[str, str] = {
    "Message": "anthropic.types.Message",
    "MessageTokensCount": "anthropic.types.MessageTokensCount",
    "RawMessageStreamEvent": "anthropic.types.RawMessageStreamEvent",
    "ErrorResponse": "anthropic.types.shared.ErrorResponse",
    "ModelInfo": "anthropic.types.ModelInfo",
}


def _closed(node: Any) -> None:
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            node["additionalProperties"] = False  # pydantic writes true: the SDK's models allow extras
        for value in node.values():
            _closed(value)
    elif isinstance(node, list):
        for value in node:
            _closed(value)


def build() -> dict[str, Any]:
    import importlib

    import anthropic
    import pydantic

    defs: dict[str, Any] = {}
    for name, path in ROOTS.items():
        module, _, attr = path.rpartition(".")
        target = getattr(importlib.import_module(module), attr)
        schema = pydantic.TypeAdapter(target).json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        defs[name] = schema
    document = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                "$comment": f"Made by llmgw/testing/anthropic/make_schemas.py from anthropic=={anthropic.__version__} "
                            f"(pydantic {pydantic.VERSION}); roots: {', '.join(ROOTS)}.",
                "$defs": dict(sorted(defs.items()))}
    _closed(document)
    return document


def main() -> int:
    json.dump(build(), sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
