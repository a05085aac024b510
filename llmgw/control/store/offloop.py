"""The store, off the event loop: one thread runs every store call of ``llmgw server``, in order.

The server's one event loop carries the agents' gRPC streams, the REST API and
the in-process router. A store call made on it holds all of them for as long as
SQLAlchemy takes: building a thousand ``ReplicaRecord`` s from rows, decoding
their JSON columns, a commit's fsync. So handlers and the reconcile loop await
``StoreThread`` instead, which hands each call to its thread and wakes the
caller with the result (or the exception) when it is done.

Why a thread of our own and not SQLAlchemy's asyncio extension over aiosqlite
(measured with ``bench/store_offload.py``; the figures are in bench/README.md):
aiosqlite moves only the driver's calls off the loop. SQLAlchemy's ORM still
runs on it, in a greenlet, and for our queries that is most of the time:
turning rows into objects and JSON columns into lists costs more than SQLite's
own work. Here the whole call, ORM included, runs on the thread; the loop only
waits for the GIL, which a busy thread hands over every switch interval (5 ms).
It also keeps the store synchronous and plain, as the unit tests use it.

One thread, not a pool: SQLite takes one writer at a time anyway, and a single
queue gives an order for free. A write handed over with ``submit`` (a node
registered, events recorded) is done before any call queued after it, so a
read awaited after a write sees it without the writer waiting for the write.

``watch_loop`` counts statements that still run on the event loop's thread
(``statements_on_loop``, served as ``llmgw_store_statements_on_loop_total``) and
logs the first with its stack, so a store call added on the loop later shows
in a test and in production instead of only as a slow heartbeat.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from sqlalchemy import event

from llmgw.control.store.base import Fenced
from llmgw.control.store.store import Store

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

_Work = tuple[Callable[[], Any], concurrent.futures.Future[Any]]


def _awaited(method: Callable[Concatenate[Store, P], T]) -> Callable[Concatenate[StoreThread, P], Awaitable[T]]:
    """``Store.method``, awaited: run on the store's thread with the same arguments."""

    async def call(self: StoreThread, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.call(method, self.store, *args, **kwargs)

    call.__name__, call.__doc__ = method.__name__, method.__doc__
    return call


class StoreThread:
    """Runs store calls on one thread of its own, in the order they were made."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llmgw-store", daemon=True)
        self._thread.start()
        self._loop_thread: int | None = None
        #: SQL statements run on the event loop's thread since ``watch_loop`` (0 when all is well).
        self.statements_on_loop = 0

    # -- running calls -----------------------------------------------------------------
    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on the store's thread, after every call queued before it.

        Cancelled before its turn (the client left), it never runs; once running, it runs to the end.
        """
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put((lambda: fn(*args, **kwargs), fut))
        return await asyncio.wrap_future(fut)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> None:
        """Queues ``fn(*args, **kwargs)`` and returns at once, for a write nobody waits on; a failure is logged."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        # Nobody awaits it, so without this a failed write (a registration's upsert, a batch
        # of events) would vanish without a trace; logged, it at least says what was lost.
        fut.add_done_callback(_log_failure)
        self._queue.put((lambda: fn(*args, **kwargs), fut))

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            fn, fut = work
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            # BaseException too: the caller's to judge, and were this thread to die, every
            # later call would wait forever.
            except BaseException as e:
                fut.set_exception(e)

    def close(self) -> None:
        """Runs what is queued, then stops the thread (the store itself stays open: its owner closes it)."""
        self._queue.put(None)
        self._thread.join()

    # -- the guard -----------------------------------------------------------------------
    def watch_loop(self) -> None:
        """From now on, counts SQL run on the calling thread, the event loop's (call it on the loop)."""
        self._loop_thread = threading.get_ident()
        if not event.contains(self.store.engine, "before_cursor_execute", self._on_statement):
            event.listen(self.store.engine, "before_cursor_execute", self._on_statement)

    def _on_statement(self, *_args: Any) -> None:
        if threading.get_ident() != self._loop_thread:
            return
        self.statements_on_loop += 1
        if self.statements_on_loop == 1:
            log.error("a store call ran on the event loop, holding every agent stream and request while it "
                      "ran; await it through StoreThread instead:\n%s", "".join(traceback.format_stack(limit=12)))

    # -- the store's calls, awaited ----------------------------------------------------------
    put_model = _awaited(Store.put_model)
    get_model = _awaited(Store.get_model)
    list_models = _awaited(Store.list_models)
    delete_model = _awaited(Store.delete_model)
    list_replicas = _awaited(Store.list_replicas)
    list_replica_states = _awaited(Store.list_replica_states)
    write_replicas = _awaited(Store.write_replicas)
    list_nodes = _awaited(Store.list_nodes)
    page_nodes = _awaited(Store.page_nodes)
    get_node = _awaited(Store.get_node)
    occupied_nodes = _awaited(Store.occupied_nodes)
    set_node_scheduling = _awaited(Store.set_node_scheduling)
    list_events = _awaited(Store.list_events)
    autoscale_states = _awaited(Store.autoscale_states)
    add_key = _awaited(Store.add_key)
    list_keys = _awaited(Store.list_keys)
    delete_key = _awaited(Store.delete_key)
    set_key_disabled = _awaited(Store.set_key_disabled)
    record_audit = _awaited(Store.record_audit)
    list_audit = _awaited(Store.list_audit)

    async def barrier(self) -> None:
        """Returns once every call queued before it has run (a write handed over with ``submit``)."""
        await self.call(lambda: None)


#: PostgreSQL's SQLSTATEs for a session it ended: idle in a transaction too long (25P03), pg_terminate_backend (57P01).
_ENDED_MID_WRITE = frozenset({"25P03", "57P01"})


def _log_failure(fut: concurrent.futures.Future[Any]) -> None:
    if fut.cancelled() or (e := fut.exception()) is None:
        return
    if isinstance(e, Fenced):
        # A deposed leader's writes are refused by design (the lease's fencing): what was lost is said, in one
        # line, and the leader's loss itself is logged where it is noticed. Not an error of this process.
        log.warning("a queued store write was refused: %s", e)
        return
    if getattr(getattr(e, "orig", None), "sqlstate", None) in _ENDED_MID_WRITE:
        # PostgreSQL ended this server's session while it waited inside the write (the server was stopped past
        # its idle-in-transaction timeout, or a standby taking the expired lease ended it): the lease is gone
        # with it, and the write is lost as a fenced one is.
        log.warning("a queued store write was lost: the database ended this server's session inside it (%s); "
                    "this server was stopped mid-write and has most likely lost the lease",
                    str(e.orig).splitlines()[0])  # type: ignore[attr-defined]
        return
    log.error("a queued store write failed", exc_info=e)

