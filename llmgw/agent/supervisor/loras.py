"""LoRA adapters in a running engine: fetched like weights, then loaded and unloaded through the engine's API.

A shard whose spec lists adapters (``ShardSpec.adapters``, from ``spec.adapters``) gets one task here
(``keep``) for as long as it lives. Once the engine is READY, and again whenever the control plane sends a
StartShard for the live shard that differs only in its adapters (``wanted``), it makes the engine hold
exactly the listed adapters:

- What the engine holds is read from the engine itself (``GET /v1/models``: the cards whose ``parent`` is
  the served name), not remembered: an agent that adopted a running engine, or an engine that kept an
  adapter after a failed unload, is seen as it is.
- An adapter to add is fetched first (remote sources through the agent's fetcher: single flight per
  source, verified, into the weights cache, as weights are; a local one is checked against the agent's
  source roots, as weights are, and used where it is), then
  loaded with vLLM's ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` (served when the engine
  runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which the control plane sets; the sim mimics it).
- One no longer listed is unloaded with ``POST /v1/unload_lora_adapter {"lora_name"}``.
- The names loaded go up in ``ShardStatus.adapters``, and why the last step failed in
  ``adapters_message``; a failed step is tried again after ``RETRY_S``. Never a restart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

import aiohttp

from llmgw.agent.fetch import records as fetch_records
from llmgw.agent.supervisor import records
from llmgw.core import sources
from llmgw.core.adapters import Adapter
from llmgw.core.errors import EngineError, FetchError, SpecError
from llmgw.core.shards import ShardSpec, ShardState

log = logging.getLogger(__name__)
#: Seconds between two tries of a load or unload that failed.
RETRY_S = 5.0
_TIMEOUT = aiohttp.ClientTimeout(total=120)  # a load reads the adapter's weights into the engine


def request_of(spec: ShardSpec, adapter: Adapter, token: str) -> fetch_records.Request | None:
    """The fetcher's request for ``adapter`` (None for a local source), with the hub settings of its shard."""
    src = sources.parse(adapter.source)
    if not src.remote:
        return None
    if src.kind == "hf":
        return fetch_records.Request(source=src, endpoint=spec.hub_endpoint, token=token)
    if src.kind == "mirror":
        return fetch_records.Request(source=src, endpoint=spec.mirror_url)
    return fetch_records.Request(source=src)


def only_adapters_differ(known: ShardSpec | None, new: ShardSpec) -> bool:
    """Whether ``new`` is ``known`` with another adapter list: what the running engine takes without a restart."""
    return (known is not None and known.adapters != new.adapters
            and dataclasses.replace(known, adapters=new.adapters) == new)


class Keeper:
    """Makes one engine hold its shard's adapters; ``wanted`` wakes it when the list changed."""

    def __init__(self, rec: records.Shard, recs: records.Records, *, http: Callable[[], aiohttp.ClientSession],
                 fetch: Callable[[fetch_records.Request], Awaitable[str]] | None, token: str,
                 interval_s: float, resolve: Callable[[str], str | None]) -> None:
        self._rec, self._recs, self._http, self._fetch = rec, recs, http, fetch
        #: A local source's path, checked against the agent's source roots as weights are (``agent.weights``).
        self._resolve = resolve
        self.token = token
        self._interval_s = interval_s
        self.wanted = asyncio.Event()
        self.wanted.set()

    async def keep(self) -> None:
        while True:
            state = self._rec.status.state
            if state in ShardState.terminal() or state in (ShardState.STOPPING, ShardState.DRAINED):
                return
            if state is not ShardState.READY:
                await asyncio.sleep(self._interval_s)
                continue
            self.wanted.clear()
            done = await self.once()
            try:
                await asyncio.wait_for(self.wanted.wait(), None if done else RETRY_S)
            except TimeoutError:
                pass

    async def once(self) -> bool:
        """One pass: unload what is not listed, load what is missing; whether the engine now holds the list."""
        spec = self._rec.status.spec
        if spec is None or not self._rec.status.endpoint:
            return False
        problems: list[str] = []
        try:
            held = await self._held(spec)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._report(self._rec.status.adapters, f"cannot list the engine's adapters: {exc}")
            return False
        want = {a.name: a for a in spec.adapters}
        for name in [n for n in held if n not in want]:
            why = await self._post(spec, "/v1/unload_lora_adapter", {"lora_name": name})
            if why:
                problems.append(f"unloading {name}: {why}")
            else:
                held.remove(name)
        for adapter in [a for a in spec.adapters if a.name not in held]:
            try:
                path = await self._path(spec, adapter)
            except (FetchError, SpecError, EngineError) as exc:
                problems.append(f"fetching {adapter.name} from {adapter.source}: {exc}")
                continue
            why = await self._post(spec, "/v1/load_lora_adapter", {"lora_name": adapter.name, "lora_path": path})
            if why:
                problems.append(f"loading {adapter.name}: {why}")
            else:
                held.append(adapter.name)
        self._report(tuple(n for n in [*want, *held] if n in held), "; ".join(problems))
        return not problems

    def _report(self, held: tuple[str, ...], message: str) -> None:
        st = self._rec.status
        if (st.adapters, st.adapters_message) != (tuple(dict.fromkeys(held)), message):
            if message:
                log.warning("shard %s: adapters: %s", st.shard_id, message)
            self._recs.move(self._rec, st.state, adapters=tuple(dict.fromkeys(held)), adapters_message=message)

    async def _path(self, spec: ShardSpec, adapter: Adapter) -> str:
        req = request_of(spec, adapter, self.token)
        if req is None:
            path = await asyncio.to_thread(self._resolve, adapter.source)
            if not path:
                raise SpecError("spec.adapters", f"{adapter.source} names no files on this node")
            return path
        if self._fetch is None:
            raise FetchError(f"{adapter.source} is remote and this agent has no weights cache to fetch it into")
        return await self._fetch(req)

    def _headers(self, spec: ShardSpec) -> dict[str, str]:
        return {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}

    async def _held(self, spec: ShardSpec) -> list[str]:
        url = self._rec.status.endpoint + "/v1/models"
        async with self._http().get(url, headers=self._headers(spec), timeout=_TIMEOUT) as resp:
            if resp.status != 200:
                raise ValueError(f"GET /v1/models answered {resp.status}")
            body = await resp.json(content_type=None)
        return [str(m["id"]) for m in body.get("data", []) if isinstance(m, dict) and m.get("parent")
                and m.get("id") != spec.served_name]

    async def _post(self, spec: ShardSpec, path: str, body: dict[str, str]) -> str:
        """"" when the engine did it; else what it (or the connection) said."""
        try:
            async with self._http().post(self._rec.status.endpoint + path, json=body, headers=self._headers(spec),
                                         timeout=_TIMEOUT) as resp:
                if resp.status == 200:
                    return ""
                text = (await resp.text())[:300]
                return f"the engine answered {resp.status}: {text}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"the engine did not answer: {exc or type(exc).__name__}"
