"""The control plane's loop run by hand in tests: an agent link that records commands, a clock the test moves.

A ``Cluster`` given these sends its commands into ``Link.sent`` instead of an
agent's stream and reads the time from ``Clock.now``, so a test runs each
reconcile pass itself and asserts on what was sent and what the store holds.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Link:
    """An agent's link that keeps each start, stop and drain sent to it as ``(verb, shard_id)``, in order."""

    def __init__(self) -> None:
        #: ``(verb, shard_id)``; a Provision as ``("provision", Provision)``.
        self.sent: list[tuple[str, Any]] = []

    def start_shard(self, spec: Any) -> None:
        self.sent.append(("start", spec.shard_id))

    def stop_shard(self, shard_id: str, *, reason: str) -> None:
        self.sent.append(("stop", shard_id))

    def drain_shard(self, shard_id: str, *, timeout_s: int) -> None:
        self.sent.append(("drain", shard_id))

    def sleep_shard(self, shard_id: str, *, level: int) -> None:
        self.sent.append(("sleep", f"{shard_id}@{level}"))

    def remove_weights(self, cache_name: str) -> None:
        self.sent.append(("remove_weights", cache_name))

    def provision(self, provision: Any) -> None:
        self.sent.append(("provision", provision))

    def close(self, reason: str) -> None:
        pass

    def request_logs(self, shard_id: str, *, lines: int, follow: bool) -> tuple[str, asyncio.Queue[Any]]:
        raise NotImplementedError

    def cancel_logs(self, request_id: str) -> None:
        pass


class Clock:
    """A clock that stands at ``now`` (1000.0 at first) until the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
