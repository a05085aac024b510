"""The agent's log ring: tail, capacity, follow from asyncio, a slow reader's drops, logging from threads."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Iterator

import pytest

from llmgw.agent import logring

_names = itertools.count()


@pytest.fixture
def ring() -> Iterator[logring.LogRing]:
    yield logring.LogRing(capacity=5)


def _logger(ring: logring.LogRing) -> logging.Logger:
    """A logger of its own, so the tests neither see nor disturb the root logger."""
    logger = logging.getLogger(f"test.logring.{next(_names)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(ring)
    return logger


def test_tail_is_the_last_lines_oldest_first(ring: logring.LogRing) -> None:
    """tail(n) gives the newest n lines in the order they were logged, formatted with level and logger."""
    log = _logger(ring)
    for i in range(3):
        log.info("line %d", i)
    lines = ring.tail(2)
    assert [line.rsplit(": ", 1)[1] for line in lines] == ["line 1", "line 2"]
    assert f" INFO {log.name}: line 2" in lines[-1]
    assert ring.tail(0) == []
    assert len(ring.tail(100)) == 3


def test_capacity_keeps_only_the_newest(ring: logring.LogRing) -> None:
    """Past capacity the oldest lines go; a traceback counts as one line per physical line."""
    log = _logger(ring)
    for i in range(8):
        log.warning("w%d", i)
    assert [line.rsplit(": ", 1)[1] for line in ring.tail(10)] == ["w3", "w4", "w5", "w6", "w7"]
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    tail = ring.tail(5)
    assert tail[-1] == "RuntimeError: boom"
    assert all("\n" not in line for line in tail)


def test_capacity_must_be_positive() -> None:
    """A ring with no room is refused at once rather than silently keeping nothing."""
    with pytest.raises(ValueError, match="at least one line"):
        logring.LogRing(capacity=0)


def test_follow_delivers_every_new_line_in_order() -> None:
    """A subscriber gets the lines logged after it subscribed, in order, and close() ends iteration."""
    ring = logring.LogRing(capacity=100)
    log = _logger(ring)

    async def main() -> list[str]:
        log.info("before")
        sub = ring.subscribe()
        seen: list[str] = []
        for i in range(20):
            log.info("n%d", i)
        async for lines, dropped in sub:
            assert dropped == 0
            seen += lines
            if len(seen) >= 20:
                sub.close()
        return seen

    seen = asyncio.run(asyncio.wait_for(main(), 5))
    assert [line.rsplit(": ", 1)[1] for line in seen] == [f"n{i}" for i in range(20)]
    assert ring.subscriber_count == 0


def test_slow_subscriber_drops_and_is_told_how_many() -> None:
    """A reader that does not keep up loses the newest lines, is told the count, and logging never waits."""
    ring = logring.LogRing(capacity=100)
    log = _logger(ring)

    async def main() -> tuple[list[str], int, list[str]]:
        with ring.subscribe(maxsize=3) as sub:
            for i in range(10):
                log.info("m%d", i)
            lines, dropped = await sub.next_batch()
            log.info("after")
            later, _ = await sub.next_batch()
            return lines, dropped, later

    lines, dropped, later = asyncio.run(asyncio.wait_for(main(), 5))
    assert [line.rsplit(": ", 1)[1] for line in lines] == ["m0", "m1", "m2"]
    assert dropped == 7
    assert later[0].endswith("after")
    assert len(ring.tail(100)) == 11  # the ring itself lost nothing


def test_lines_logged_from_another_thread_reach_the_loop() -> None:
    """A record logged on a worker thread wakes the subscriber's event loop."""
    ring = logring.LogRing(capacity=100)
    log = _logger(ring)

    async def main() -> list[str]:
        with ring.subscribe() as sub:
            worker = threading.Thread(target=lambda: [log.info("from thread %d", i) for i in range(50)])
            worker.start()
            seen: list[str] = []
            while len(seen) < 50:
                lines, _ = await sub.next_batch()
                seen += lines
            worker.join()
            return seen

    seen = asyncio.run(asyncio.wait_for(main(), 5))
    assert [line.rsplit(": ", 1)[1] for line in seen] == [f"from thread {i}" for i in range(50)]


def test_tail_and_subscribe_has_no_gap_and_no_repeat() -> None:
    """The backlog and the live lines meet exactly: nothing lost or shown twice between them."""
    ring = logring.LogRing(capacity=100)
    log = _logger(ring)

    async def main() -> tuple[list[str], list[str]]:
        log.info("a")
        log.info("b")
        tail, sub = ring.tail_and_subscribe(10)
        with sub:
            log.info("c")
            lines, _ = await sub.next_batch()
        return tail, lines

    tail, lines = asyncio.run(main())
    assert [line[-1] for line in tail] == ["a", "b"]
    assert [line[-1] for line in lines] == ["c"]


def test_subscriber_whose_loop_ended_is_dropped() -> None:
    """A subscription left open when its loop closed is removed at the next record, not kept filling."""
    ring = logring.LogRing(capacity=10)
    log = _logger(ring)

    async def main() -> None:
        ring.subscribe()

    asyncio.run(main())
    log.info("x")
    log.info("y")
    assert ring.subscriber_count == 0
    assert ring.tail(1)[0].endswith("y")


def test_subscribe_needs_a_running_loop(ring: logring.LogRing) -> None:
    """Subscribing outside asyncio fails at once instead of never waking anybody."""
    with pytest.raises(RuntimeError):
        ring.subscribe()


def test_install_attaches_to_root_once() -> None:
    """install() adds the ring to the root logger at the given level, and a second call does not add it again."""
    ring = logring.LogRing(capacity=10)
    root = logging.getLogger()
    try:
        logring.install(ring, level=logging.WARNING)
        logring.install(ring, level=logging.WARNING)
        assert root.handlers.count(ring) == 1
        assert ring.level == logging.WARNING
        logging.getLogger("test.logring.install").error("seen")
        logging.getLogger("test.logring.install").info("not seen")
        assert [line.rsplit(": ", 1)[1] for line in ring.tail(10)] == ["seen"]
    finally:
        root.removeHandler(ring)
