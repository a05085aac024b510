"""Steady chat load through a router, for failover tests and benches: requests one after another."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import openai


class ChatLoad:
    """Chat requests one after another through a router (the openai client, no retries), streamed and not in
    turn; every failure is kept with its time (``time.monotonic``). A context manager: runs while inside."""

    def __init__(self, url: str, model: str) -> None:
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=20)
        self.model, self.ok = model, 0
        self.failed: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in itertools.count():
            if self._stop.is_set():
                return
            try:
                msgs: Any = [{"role": "user", "content": f"hi {i}"}]
                if i % 2:
                    chunks = list(self.client.chat.completions.create(model=self.model, messages=msgs, max_tokens=8,
                                                                      stream=True))
                    assert chunks, "no chunk"
                else:
                    out = self.client.chat.completions.create(model=self.model, messages=msgs, max_tokens=8)
                    assert out.choices[0].message.content, "no content"
                self.ok += 1
            except Exception as e:  # noqa: BLE001 (every failure is a finding)
                self.failed.append((time.monotonic(), f"{type(e).__name__}: {e}"[:300]))

    def __enter__(self) -> ChatLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
