"""Processes and ports for tests and benchmarks.

Tests here start real processes (engines, servers, agents) rather than fakes,
so each one must be cleaned up even when the test fails, and only the
processes a test started may be ended. ``Proc`` starts its child in a new
session, which makes the child's process group id equal to its pid: signalling
that group reaches the child and everything it spawned, and nothing else.

Readiness is "it answers over HTTP", never "its pid exists": an engine that
is still loading, or that died on a bad flag, has a pid too.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Callable[[], object], *, timeout: float, interval: float = 0.05,
             what: str = "condition") -> object:
    """Poll ``predicate`` until it returns something truthy and return that, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.1f}s")
        time.sleep(interval)


def _ok(status: int, body: bytes) -> bool:
    return status == 200


class Proc:
    """A child process in its own session, with its output in a log file."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, log_file: IO[bytes]) -> None:
        self.popen = popen
        self.log_path = log_path
        self._log_file = log_file

    @classmethod
    def start(cls, argv: Sequence[str], *, env: Mapping[str, str] | None = None, log_path: Path,
              cwd: str | Path | None = None) -> Proc:
        """Launch ``argv`` (no shell) with stdout and stderr going to ``log_path``.

        ``env`` replaces the environment when given; pass ``{**os.environ, ...}`` to add to it.
        """
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "wb")  # closed in stop()
        try:
            popen = subprocess.Popen(
                list(argv), stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else None, cwd=cwd,
                # A new session makes pgid == pid, so stop() can signal the whole group
                # (the child and anything it forked) without touching anyone else's.
                start_new_session=True,
            )
        except BaseException:
            log_file.close()
            raise
        return cls(popen, log_path, log_file)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit code, or None while it runs."""
        return self.popen.poll()

    def log_tail(self, n: int = 30) -> str:
        """The last ``n`` lines the process wrote."""
        try:
            with open(self.log_path, "rb") as f:
                lines = collections.deque(f, maxlen=n)
        except FileNotFoundError:
            return ""
        return b"".join(lines).decode("utf-8", "replace")

    def wait_http(self, url: str, *, timeout: float = 30.0, headers: Mapping[str, str] | None = None,
                  expect: Callable[[int, bytes], bool] = _ok,
                  context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
        """Poll ``url`` until ``expect(status, body)`` holds; return (status, body).

        Raises TimeoutError, with the end of the log, when the process exits first or
        ``timeout`` passes, so a failed start shows why instead of "connection refused".
        """
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while True:
            code = self.popen.poll()
            if code is not None:
                raise TimeoutError(f"process {self.pid} exited with {code} before {url} answered; "
                                   f"last output:\n{self.log_tail(30)}")
            request = urllib.request.Request(url, headers=dict(headers or {}))
            try:
                with urllib.request.urlopen(request, timeout=2.0, context=context) as response:
                    status, body = response.status, response.read()
            except urllib.error.HTTPError as e:
                status, body = e.code, e.read()
            except (OSError, urllib.error.URLError) as e:
                status, body, last = 0, b"", repr(e)
            if status and expect(status, body):
                return status, body
            if status:
                last = f"{status} {body[:200]!r}"
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{url} did not answer as expected within {timeout:.1f}s (last: {last}); "
                                   f"last output of process {self.pid}:\n{self.log_tail(30)}")
            time.sleep(0.05)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group this Proc created, if it still exists."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, *, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, wait up to ``timeout``, then SIGKILL it. Returns the exit code.

        Calling it again returns the same code and signals nothing: once the group is gone its
        id may be reused by a process that is not ours.
        """
        if self._log_file.closed:
            return self.popen.returncode
        try:
            if self.popen.poll() is None:
                self.signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.signal(signal.SIGKILL)
                    self.popen.wait(timeout=5.0)
            # The leader may have exited on SIGTERM while a child it forked ignored it:
            # kill what is left of the group, or it outlives the test.
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return self.popen.returncode
        finally:
            self._log_file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
