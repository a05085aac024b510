"""The sim engine's LoRA adapters, mimicking vLLM 0.32's runtime LoRA API so the agent and router paths
that load, list and route adapters are tested without a real engine.

What is mimicked, from vLLM 0.32 (``vllm/entrypoints/serve/lora/api_router.py``, ``protocol.py`` and
``vllm/entrypoints/openai/models/serving.py``; documented at https://docs.vllm.ai, "LoRA Adapters",
"Dynamically serving LoRA Adapters"):

- The routes exist only when the engine runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` true (vLLM attaches
  its LoRA router only then) and LoRA is enabled (``--enable-lora``; the sim takes the flag, and vLLM's
  ``--max-lora-rank`` and ``--max-loras``, which it accepts and does not enforce).
- The engine's limit (``--max-cpu-loras``, ``--max-loras`` when not given: ``vllm/config/lora.py``): what
  is *registered* (loaded through the API, listed in ``/v1/models``) is not bounded, what the worker
  *holds* is. vLLM's ``LRUCacheWorkerLoRAManager.add_adapter`` (``vllm/lora/worker_manager.py``) runs
  for each load through the API and for each request's adapter: a held one is touched (most recently
  used), one not held is read from its path and, with ``capacity`` held already, the least recently
  used is evicted (``LRUCacheLoRAModelManager.remove_oldest_adapter``, ``vllm/lora/model_manager.py``).
  So a request for a registered adapter that was evicted is served: its engine loads it again on demand
  (``--lora-load-delay`` seconds here). The worker keys its cache by ``lora_int_id``: an unload only
  forgets the name (``OpenAIServingModels.unload_lora_adapter``), its weights stay held until evicted,
  and a name loaded again gets a new id. ``/sim/stats``'s ``lora`` shows the cache (least recent first),
  and how many loads and evictions it made.
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
import itertools
import os

from aiohttp import web

from .protocol import Json, error, json_body

#: vLLM's variable that attaches its runtime LoRA routes.
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_updating() -> bool:
    """Whether the environment turns runtime loading on, as vLLM's ``envs`` reads it ("true" or "1")."""
    return os.environ.get(RUNTIME_ENV, "0").strip().lower() in ("1", "true")


class Loras:
    """The adapters registered in one sim engine (name to path, in load order) and its worker's LRU cache."""

    def __init__(self, base: str, *, enabled: bool, capacity: int = 1, load_delay: float = 0.0) -> None:
        self.base = base
        self.enabled = enabled
        self.loaded: dict[str, str] = {}
        #: The cache's size: vLLM's ``max_cpu_loras`` (``--max-cpu-loras``, else ``--max-loras``).
        self.capacity = capacity
        self.load_delay = load_delay
        #: The registered names' ``lora_int_id`` (vLLM's ``lora_id_counter``, from 1); the cache holds ids.
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._counter = itertools.count(1)
        self.held: tuple[int, ...] = ()
        self.loads = 0
        self.evictions = 0

    def stats(self) -> Json:
        return {"capacity": self.capacity, "held": [self._names[i] for i in self.held],
                "registered": list(self.loaded), "loads": self.loads, "evictions": self.evictions}

    async def use(self, name: str) -> None:
        """A request's adapter, as vLLM's worker takes it: touched when held, else loaded (evicting at the limit)."""
        await self._add(self._ids[name])

    async def _add(self, lora_id: int) -> None:
        if lora_id not in self.held:
            self.loads += 1
            if self.load_delay > 0:
                await asyncio.sleep(self.load_delay)
        # touch is vLLM's rule; the worker loads before evicting, so a load that raced another settles here.
        # Imported here, as kvcache is: the sim's wheel ships alone (llmgw.testing.wheelhouse), without llmgw,
        # and an adapter's request is what needs it.
        from llmgw.core.adapteraffinity import touch

        self.held, evicted = touch(self.held, lora_id, self.capacity)
        self.evictions += len(evicted)

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
        lora_id = self._ids.get(name) or next(self._counter)  # load_inplace keeps the id, as vLLM does
        await self._add(lora_id)  # vLLM's add_lora "preloads it for incoming requests": into the cache
        self._ids[name], self._names[lora_id] = lora_id, name
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
        del self._ids[name]  # the id (and its weights, while held) stays in the worker's cache
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
