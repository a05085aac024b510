"""Response-head bytes the router's HTTP server writes, precomputed: status lines, the date once a second."""

from __future__ import annotations

import email.utils
import http
import time

STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
                for status in http.HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


class Clock:
    """The ``date`` header, formatted once a second rather than once a response."""

    def __init__(self) -> None:
        self.second = 0
        self.header = b""

    def date(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.header = b"date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return self.header
