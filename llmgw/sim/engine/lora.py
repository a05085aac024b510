"""The sim engine's LoRA adapters, mimicking vLLM 0.32's runtime LoRA API so the agent and router paths
that load, list and route adapters are tested without a real engine.

What is mimicked, from vLLM 0.32 (``vllm/entrypoints/serve/lora/api_router.py``, ``protocol.py`` and
``vllm/entrypoints/openai/models/serving.py``; documented at https://docs.vllm.ai, "LoRA Adapters",
"Dynamically serving LoRA Adapters"):

- The routes exist only when the engine runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` true (vLLM attaches
  its LoRA router only then) and LoRA is enabled (``--enable-lora``; the sim takes the flag, and vLLM's
  ``--max-lora-rank``/``--max-loras``/``--max-cpu-loras``, which it accepts and does not enforce).
- ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``: 200 with the text ``Success: LoRA adapter
  'NAME' added successfully.``; 400 ``InvalidUserInput`` when either is missing, when the name is the
  base model's, or when it is loaded already (without ``load_inplace``); 404 ``NotFoundError`` when the
  path does not exist (vLLM's ``LoRAAdapterNotFoundError``).
- ``POST /v1/unload_lora_adapter {"lora_name"}``: 200 ``Success: LoRA adapter 'NAME' removed
  successfully.``; 404 ``NotFoundError`` when it is not loaded.
- ``GET /v1/models`` lists each loaded adapter after the base: ``{"id": NAME, "root": PATH, "parent":
  BASE}``; a completion whose ``model`` names an adapter is answered under that name.

Unlike vLLM the sim's answer is not a model's: an adapter's tokens carry its name (`` NAME:tok0 ...``),
so that a test sees which adapter answered.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from .protocol import Json, error, json_body

#: vLLM's variable that attaches its runtime LoRA routes.
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updating() -> bool:
    """Whether the environment turns runtime loading on, as vLLM's ``envs`` reads it ("true" or "1")."""
    return os.environ.get(RUNTIME_ENV, "0").strip().lower() in ("1", "true")


class Loras:
    """The adapters loaded into one sim engine: name to path, in load order."""

    def __init__(self, base: str, *, enabled: bool) -> None:
        self.base = base
        self.enabled = enabled
        self.loaded: dict[str, str] = {}

    def add_routes(self, app: web.Application) -> None:
        if runtime_updating():
            app.router.add_post("/v1/load_lora_adapter", self.load)
            app.router.add_post("/v1/unload_lora_adapter", self.unload)

    def cards(self, created: int) -> list[Json]:
        return [{"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": path,
                 "parent": self.base} for name, path in self.loaded.items()]

    def serves(self, model: object) -> bool:
        return isinstance(model, str) and model in self.loaded

    async def load(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            return error(400, "Both 'lora_name' and 'lora_path' must be provided.", type_="InvalidUserInput")
        if not self.enabled:
            return error(500, "LoRA is not enabled. Use --enable-lora to enable LoRA.",
                         type_="InternalServerError")
        if name == self.base:
            return error(400, f"The lora adapter '{name}' conflicts with a served base model.",
                         type_="InvalidUserInput")
        if name in self.loaded and not body.get("load_inplace"):
            return error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                              "adapter in place, set 'load_inplace' to True.", type_="InvalidUserInput")
        if not await asyncio.to_thread(os.path.exists, path):
            return error(404, f"Loading lora {name} failed: No adapter found for {path}", type_="NotFoundError")
        self.loaded[name] = path
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body, web.Response):
            return body
        name = body.get("lora_name")
        if not name:
            return error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", type_="InvalidUserInput")
        if name not in self.loaded:
            return error(404, f"The lora adapter '{name}' cannot be found.", type_="NotFoundError")
        del self.loaded[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
