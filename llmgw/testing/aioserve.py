"""An aiohttp app served on 127.0.0.1 for the length of a test: ``async with serving(app) as url``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serving(made: web.Application) -> AsyncIterator[str]:
    """Serve ``made`` on a free loopback port; its base URL inside, the server gone after (a short shutdown:
    held long polls are dropped, not answered)."""
    runner = web.AppRunner(made, shutdown_timeout=0.1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
