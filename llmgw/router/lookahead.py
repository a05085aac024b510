"""What the forwarder reads of an engine's answer before it hands the response over or tries elsewhere.

``upstream.Forwarder.open`` may still retry until a byte has gone to the client, so whatever it must
see first is read here: the prefill progress events a llama.cpp stream starts with (``past_progress``,
read and dropped), llama.cpp's 500 for an input over its batch (``input_too_large``: the client's to
fix, relayed as a 400), and the start of a refused answer's body for the 502 (``snippet``). A failed
attempt is ``AttemptFailed``, with ``describe`` for what its client error said.
"""

from __future__ import annotations

from llmgw.router import client, openai_errors
from llmgw.router.table import ModelRoute

#: In llama.cpp's 500 for an input longer than its physical batch (an embedding on a CPU replica's
#: 64-token batch, ``agent/engines/llamacpp.py``): the client's to shorten, so relayed as a 400 and not
#: counted against the replica (three in a row, one openai call and its two retries, would eject it).
_INPUT_TOO_LARGE = b") is too large to process"
#: What marks one of llama.cpp's prefill progress events (``"return_progress": true``).
_PROGRESS_EVENT = b'"prompt_progress"'
#: Bytes read ahead without finding where an event ends: not the SSE expected, so it is all relayed.
_LOOKAHEAD_LIMIT = 65536


class AttemptFailed(Exception):
    """One attempt at one engine failed before a byte went to the client: the forwarder tries the next."""

    def __init__(self, why: str, *, at_once: bool = False) -> None:
        super().__init__(why)
        self.at_once = at_once  # the engine failed TLS verification: ejected at once (``health``)


def input_too_large(route: ModelRoute, response: client.Response) -> bool:
    """llama.cpp's 500 refusing an input over its physical batch, when its body came with the headers."""
    body = response.arrived() if route.engine == "llamacpp" and response.status == 500 else None
    return body is not None and _INPUT_TOO_LARGE in body


async def past_progress(response: client.Response) -> None:
    """Read and drop the progress events a stream starts with; the first other event and the rest stay.

    llama.cpp writes one event per prefill batch, each on its own, before the first
    token's. Reading them here rather than in the relay keeps what reaches the client,
    and when, exactly as without them, and an engine that fails during the prefill is
    still retried on another replica: no byte has gone to the client. A cancel (the
    client left) or a break closes the response, which is what makes the engine stop:
    its next progress write fails.
    """
    try:
        if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return
        pending = b""
        while chunk := await response.readany():
            pending = pending + chunk if pending else chunk
            while (end := pending.find(b"\n\n")) >= 0 and _PROGRESS_EVENT in pending[:end]:
                pending = pending[end + 2:]
            if pending.find(b"\n\n") >= 0 or len(pending) > _LOOKAHEAD_LIMIT:
                break
        response.unread(pending)
    except client.ClientError as exc:
        response.close()
        raise AttemptFailed(f"the stream broke during the prefill: {describe(exc)}") from None
    except BaseException:
        response.close()
        raise


def describe(exc: BaseException) -> str:
    """An exception's message for the 502's list of attempts, at most 200 characters."""
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


async def snippet(response: client.Response) -> str:
    """The start of a refused answer's body, in parentheses ("" when none); the response is closed."""
    try:
        text = (await response.content.read(300)).decode("utf-8", "replace").strip()
    except client.ClientError:
        text = ""
    finally:
        response.close()
    # An HTML error page (a proxy in front of the engine) as its title, not its markup.
    return f"({openai_errors.summary(text)})" if text else ""
