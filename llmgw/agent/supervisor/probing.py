"""Is an engine ready? It answers its health path with 200 AND lists its served model.

Health alone is not enough: some engines answer /health while their model list
is still empty, and traffic sent then gets 404s for a model "that does not
exist". A pid is not enough either: a loading engine has one, and so does one
wedged in a collective. Each request has a short timeout so a hung engine
delays the next probe, never the event loop.

``health`` is the liveness probe of an engine that is already ready: its
cheap health path only, and the reason in words when it does not answer 200
(``liveness`` decides what that means). ``in_flight`` asks an engine how many
requests it holds, for a drain; where to ask and how to read the answer are
the adapter's (``in_flight_probe``).
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

PROBE_TIMEOUT_S = 2.0


async def probe(session: aiohttp.ClientSession, endpoint: str, *, health_path: str, served_name: str,
                api_key: str = "", timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the engine is ready; otherwise what it is not doing yet, in words."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(endpoint + health_path, timeout=timeout) as r:
            if r.status != 200:
                return f"{health_path} answered {r.status}"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        async with session.get(endpoint + "/v1/models", headers=headers, timeout=timeout) as r:
            if r.status != 200:
                return f"/v1/models answered {r.status}"
            body = await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"no answer from {endpoint} ({type(exc).__name__})"
    except ValueError:
        return "/v1/models did not answer JSON"
    data = body.get("data") if isinstance(body, dict) else None
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    if served_name not in ids:
        return f"/v1/models does not list {served_name!r} yet (it lists {ids})"
    return None


async def health(session: aiohttp.ClientSession, endpoint: str, *, health_path: str, api_key: str = "",
                 timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the engine answers ``health_path`` with 200 within ``timeout_s``; otherwise why not, in words.

    The key goes along when the shard has one: llama.cpp leaves /health open,
    but an engine that guards it would answer 401, and a probe that read that
    as a hang would have a healthy engine replaced.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(endpoint + health_path, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return f"{health_path} answered {r.status} {r.reason or ''}".rstrip()
            await r.read()
    except TimeoutError:
        # What a frozen engine looks like: the kernel still accepts the
        # connection into the listen backlog, and nothing ever answers.
        return f"timed out after {timeout_s:g} s"
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, ConnectionRefusedError):
            return f"connection refused at {endpoint}"
        return f"cannot connect to {endpoint}: {exc.os_error.strerror or exc.os_error}"
    except aiohttp.ClientError as exc:
        return f"no answer from {endpoint}{health_path} ({type(exc).__name__}: {exc})"
    return None


async def in_flight(session: aiohttp.ClientSession, endpoint: str, path: str, parse: Callable[[bytes], int | None],
                    *, api_key: str = "", timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int | None, str]:
    """How many requests the engine has running or queued, and in words why when that is unknown (None).

    The adapter's parser sees only the body of a 200: an engine that answers
    401 or 404 has said nothing about its requests, and a drain must not read
    that as "none in flight" and let a stop cut them off.
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(endpoint + path, headers=headers, timeout=timeout) as r:
            if r.status != 200:
                return None, f"{path} answered {r.status}"
            body = await r.read()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return None, f"no answer from {endpoint}{path} ({type(exc).__name__})"
    count = parse(body)
    if count is None:
        return None, f"{path} did not say how many requests are in flight"
    return count, f"{count} in flight"


#: How long a sleep or a wake may take: a wake from level 2 reloads the weights from disk.
SLEEP_TIMEOUT_S = 300.0


async def sleep(session: aiohttp.ClientSession, endpoint: str, level: int, *, api_key: str = "",
                timeout_s: float = SLEEP_TIMEOUT_S) -> str | None:
    """Put the engine to sleep at ``level`` (1, 2) or wake it (0) through vLLM's API; None when done, else why not.

    vLLM's routes (``POST /sleep?level=N``, ``POST /wake_up``, served with ``--enable-sleep-mode`` and
    ``VLLM_SERVER_DEV_MODE=1``) answer 200 once done; a 404 means the engine was started without them.
    """
    # mode=wait (newer vLLM; older ones ignore it): a request that reached the engine as it was told to sleep
    # finishes first instead of being aborted.
    path = f"/sleep?level={level}&mode=wait" if level else "/wake_up"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.post(endpoint + path, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            body = await r.read()
            if r.status == 404:
                return (f"{path} answered 404: the engine runs without its sleep mode (vLLM: --enable-sleep-mode "
                        "and VLLM_SERVER_DEV_MODE=1)")
            if r.status != 200:
                return f"{path} answered {r.status}: {body[:200].decode(errors='replace')}"
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"no answer from {endpoint}{path} ({type(exc).__name__})"
    return None


async def is_sleeping(session: aiohttp.ClientSession, endpoint: str, *, api_key: str = "",
                      timeout_s: float = PROBE_TIMEOUT_S) -> bool | None:
    """vLLM's ``GET /is_sleeping`` (``{"is_sleeping": bool}``); None when the engine does not say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(endpoint + "/is_sleeping", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            doc = await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    said = doc.get("is_sleeping") if isinstance(doc, dict) else None
    return said if isinstance(said, bool) else None
