"""LoRA adapters of an engine given them at start (llama.cpp's ``--lora FILE``, SGLang's ``--lora-paths NAME=DIR``;
``adapters.AT_START``).

Unlike vLLM's (``loras``: loaded into the running engine), these are files on the engine's command line:

- ``paths``: before the launch, each adapter of ``spec.adapters`` is fetched like the weights (remote sources
  through the agent's fetcher, with the shard FETCHING and its progress in ``ShardStatus.fetch`` as for
  weights; a local file resolved as weights are, within the agent's source roots), in the spec's order: a
  request's ``lora`` id is the adapter's index (``router/loraroute.py``). For llama.cpp a directory (an hf
  repository) must hold exactly one ``.gguf``, the adapter; SGLang takes the directory.
- ``keep``: once the engine is READY, llama.cpp's ``GET /lora-adapters`` must list as many adapters as the spec,
  each at scale 0 (a llama-server that applied them to every request is set to 0 with ``POST
  /lora-adapters``); the names then go up in ``ShardStatus.adapters`` (the router sends an adapter's
  requests only to engines that hold it), or why not in ``adapters_message``.

A change to the list is a new fingerprint, so a new shard: nothing here changes a running engine's list.

``fetch_shown`` is the fetch that ``loras.Keeper`` (vLLM's adapters, loaded while the engine serves) is
given: its progress goes up in ``ShardStatus.fetch`` of the READY shard, as a fetch's before a launch does,
and is cleared when the fetch ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from llmgw.agent.fetch import records as fetch_records
from llmgw.agent.supervisor import fetching, loras, records
from llmgw.core import adapters as adapters_mod
from llmgw.core.errors import EngineError, FetchError, SpecError
from llmgw.core.shards import ShardSpec, ShardState

log = logging.getLogger(__name__)
_TIMEOUT = aiohttp.ClientTimeout(total=30)
Fetch = Callable[[fetch_records.Request, Callable[[fetch_records.Progress], None]], Awaitable[str]]


def at_start(spec: ShardSpec) -> bool:
    """Whether ``spec``'s engine takes its adapters as files at start."""
    return bool(spec.adapters) and spec.engine in adapters_mod.AT_START


def remote(spec: ShardSpec) -> bool:
    """Whether an adapter must be fetched before ``spec``'s launch."""
    return at_start(spec) and any(fetching.is_remote(a.source) for a in spec.adapters)


async def fetch_shown(rec: records.Shard, recs: records.Records, ensure: Fetch, clock: Callable[[], float],
                      req: fetch_records.Request) -> str:
    """``ensure(req)`` with its progress in the shard's ``fetch`` (its state unchanged), cleared at the end."""
    throttle = fetching.Throttle(clock)

    def on_progress(p: fetch_records.Progress) -> None:
        got = fetching.progress_of(p)
        if throttle.due(got):
            recs.move(rec, rec.status.state, fetch=got, quiet=True)

    try:
        return await ensure(req, on_progress)
    finally:
        if rec.status.fetch is not None:
            recs.move(rec, rec.status.state, fetch=None, quiet=True)


def gguf_in(path: str, name: str) -> str:
    """``path`` itself (a file), or the one ``.gguf`` in it (a directory); SpecError naming the adapter if not."""
    if os.path.isfile(path):
        return path
    found = sorted(str(p) for p in Path(path).rglob("*.gguf")) if os.path.isdir(path) else []
    if len(found) != 1:
        raise SpecError("spec.adapters", f"adapter {name}: llama.cpp takes one GGUF LoRA file, and {path} holds "
                                         f"{len(found)} .gguf files; point its source at the one file")
    return found[0]


async def paths(rec: records.Shard, recs: records.Records, spec: ShardSpec, *, fetch: Fetch | None,
                resolve: Callable[[str], str | None], resolve_dir: Callable[[str], str | None],
                clock: Callable[[], float]) -> tuple[str, ...]:
    """The local file (llama.cpp) or directory (SGLang: as PEFT saves one, ``resolve_dir``) of each adapter,
    fetched where remote; FetchError or SpecError when one cannot be had."""
    files = spec.engine in adapters_mod.BY_ID
    if not files:
        resolve = resolve_dir
    out: list[str] = []
    for adapter in spec.adapters:
        req = loras.request_of(spec, adapter, spec.hub_token)
        if req is None:
            try:  # a file, as weights are: within the agent's source roots
                path = await asyncio.to_thread(resolve, adapter.source)
            except EngineError as exc:
                raise SpecError("spec.adapters", f"adapter {adapter.name}: {exc}") from None
            if not path:
                raise SpecError("spec.adapters", f"adapter {adapter.name}: {adapter.source} names no files on this "
                                                 "node (or none under the agent's source_roots)")
        elif fetch is None:
            raise FetchError(f"adapter {adapter.name}: {adapter.source} is remote and this agent has no weights "
                             "cache to fetch it into")
        else:
            throttle = fetching.Throttle(clock)

            def on_progress(p: fetch_records.Progress, source: str = adapter.source,
                            th: fetching.Throttle = throttle) -> None:
                got = fetching.progress_of(p)
                if rec.status.state is ShardState.FETCHING and th.due(got):
                    recs.move(rec, ShardState.FETCHING, fetch=got, message=fetching.describe(source, got), quiet=True)

            path = await fetch(req, on_progress)
        out.append(await asyncio.to_thread(gguf_in, path, adapter.name) if files else path)
    if rec.status.state is ShardState.FETCHING and not fetching.is_remote(spec.source):
        # The weights are local: no fetch of theirs moves the shard on (``Supervisor._fetch``).
        recs.move(rec, ShardState.STARTING, fetch=None, message="fetched its adapters; launching")
    return tuple(out)


async def keep(rec: records.Shard, recs: records.Records, *, http: Callable[[], aiohttp.ClientSession],
               interval_s: float) -> None:
    """Once READY, checks the engine holds the spec's adapters at scale 0 and reports their names."""
    while rec.status.state is not ShardState.READY:
        state = rec.status.state
        if state in ShardState.terminal() or state in (ShardState.STOPPING, ShardState.DRAINED):
            return
        await asyncio.sleep(interval_s)
    spec = rec.status.spec
    if spec is None:
        return
    while True:
        try:  # SGLang: it refuses to start on an adapter it cannot load, so READY is proof enough
            message = await _check(rec.status.endpoint, spec, http()) if spec.engine in adapters_mod.BY_ID else ""
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            message = f"cannot read the engine's /lora-adapters: {exc or type(exc).__name__}"
        held = adapters_mod.names(spec.adapters) if not message else ()
        if message:
            log.warning("shard %s: adapters: %s", spec.shard_id, message)
        recs.move(rec, rec.status.state, adapters=held, adapters_message=message)
        if not message or rec.status.state is not ShardState.READY:
            return
        await asyncio.sleep(loras.RETRY_S)


async def _check(endpoint: str, spec: ShardSpec, session: aiohttp.ClientSession) -> str:
    """"" when the engine lists the spec's adapters, each at scale 0 (set so if not); else what is wrong."""
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    async with session.get(endpoint + "/lora-adapters", headers=headers, timeout=_TIMEOUT) as resp:
        if resp.status != 200:
            raise ValueError(f"GET /lora-adapters answered {resp.status}")
        listed = await resp.json(content_type=None)
    if not isinstance(listed, list) or len(listed) != len(spec.adapters):
        return (f"the engine holds {len(listed) if isinstance(listed, list) else 0} adapters, not the "
                f"{len(spec.adapters)} it was started with")
    if any(isinstance(a, dict) and a.get("scale") for a in listed):
        body = [{"id": i, "scale": 0.0} for i in range(len(listed))]
        async with session.post(endpoint + "/lora-adapters", json=body, headers=headers, timeout=_TIMEOUT) as resp:
            if resp.status != 200:
                return f"POST /lora-adapters (every scale to 0) answered {resp.status}"
    return ""
