"""A standalone router's ``/v1/files`` and ``/v1/batches``: passed to the control plane it follows (issue 32).

The control plane serves files and batches (``control.batches``: they live in its store); a client of a standalone
router's OpenAI port reaches them there as it would on ``llmgw server``'s. The request goes as it came (method,
path, query, body, its ``Authorization`` and ``Content-Type``: the client's API key is what the control plane
checks) to the control plane followed now, so a failover moves it with the table; the answer comes back as the
control plane wrote it. A control plane that does not answer is a 502 in OpenAI's shape saying so.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping

import aiohttp
import yarl

from llmgw.router import asgi, controltls, errors

log = logging.getLogger(__name__)
#: The request headers that carry meaning for files and batches; nothing else goes.
PASSED = (b"authorization", b"content-type", b"accept", b"openai-organization", b"openai-project")
RETURNED = frozenset({b"content-type", b"content-disposition", b"retry-after"})


class ControlPass:
    def __init__(self, control_url: Callable[[], str], *, ssl_context: ssl.SSLContext | None = None,
                 max_body_bytes: int = 256 << 20, headers: Mapping[str, str] | None = None) -> None:
        """``headers``: added to each request (a hub's worker: the hub's secret, ``hubfiles.WORKER_HEADER``)."""
        self._control_url, self._ssl, self._max = control_url, ssl_context, max_body_bytes
        self._own = dict(headers or {})
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            self._session = controltls.session(self._ssl, timeout=aiohttp.ClientTimeout(total=600, connect=5),
                                               auto_decompress=False)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def forward(self, method: str, path_qs: str, headers: Mapping[str, str], data: object
                      ) -> tuple[int, bytes, list[tuple[bytes, bytes]], str]:
        """The request sent on to the control plane followed now, with this pass's own headers: (status, body,
        the answer's headers ``RETURNED`` keeps but its type, its content type). Raises ``aiohttp.ClientError`` or
        ``TimeoutError`` when it does not answer."""
        await self.start()
        assert self._session is not None
        target = self._control_url().rstrip("/") + path_qs
        async with self._session.request(method, yarl.URL(target, encoded=True), headers={**headers, **self._own},
                                         data=data, allow_redirects=False,
                                         skip_auto_headers=("Content-Type", "Accept-Encoding")) as resp:
            extra = [(k.lower(), v) for k, v in resp.raw_headers if k.lower() in RETURNED and k.lower() !=
                     b"content-type"]
            return resp.status, await resp.read(), extra, resp.headers.get("content-type", "application/json")

    async def __call__(self, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
        body = await asgi.read_body(receive, limit=self._max)
        path_qs = scope["raw_path"].decode("latin-1")
        if scope.get("query_string"):
            path_qs += "?" + scope["query_string"].decode("latin-1")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() in PASSED}
        try:
            status, answer, extra, content_type = await self.forward(scope["method"], path_qs, headers, body or None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("the control plane did not answer %s %s: %s", scope["method"], scope["path"],
                        str(exc) or type(exc).__name__)
            raise errors.ApiError(502, "This router could not reach its control plane, which serves files and "
                                       "batches; retry.", type="service_unavailable", code="control_unreachable") \
                from None
        await asgi.send_bytes(send, status, answer, extra=extra or None, content_type=content_type.encode())
