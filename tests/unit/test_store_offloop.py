"""The store's thread: calls run there in order, failures reach the caller, SQL on the loop is counted."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from llmgw.control.events import Event
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store
from llmgw.core import specs

MODEL = specs.parse_manifest({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"},
                              "spec": {"engine": "sim", "replicas": 1}})


@pytest.fixture
def db(tmp_path: Path) -> StoreThread:
    store = Store.open(tmp_path)
    db = StoreThread(store)
    yield db  # type: ignore[misc]
    db.close()
    store.close()


def test_a_call_runs_on_the_store_thread_not_the_loop(db: StoreThread) -> None:
    """An awaited call runs on the store's own thread and its result comes back to the caller."""

    async def main() -> tuple[int, int, str | None]:
        ran_on = await db.call(threading.get_ident)
        stored, _ = await db.put_model(MODEL)
        got = await db.get_model("m")
        return threading.get_ident(), ran_on, got.model.name if got and stored else None

    loop_thread, ran_on, name = asyncio.run(main())
    assert ran_on != loop_thread and ran_on == db._thread.ident and name == "m"


def test_a_queued_write_is_seen_by_the_next_read(db: StoreThread) -> None:
    """A write handed over without waiting is done before a read queued after it."""

    async def main() -> list[str]:
        db.submit(Store.add_events, db.store, [Event(1.0, "Normal", f"R{i}", "model/m", "x") for i in range(50)])
        return [e.reason for e in await db.list_events()]

    assert asyncio.run(main()) == [f"R{i}" for i in range(50)]


def test_a_failure_reaches_the_awaiting_caller(db: StoreThread) -> None:
    """An exception raised on the store's thread is raised where the call was awaited, and the thread goes on."""

    def boom() -> None:
        raise ValueError("no such thing")

    async def main() -> list[str]:
        with pytest.raises(ValueError, match="no such thing"):
            await db.call(boom)
        return [m.model.name for m in await db.list_models()]

    assert asyncio.run(main()) == []


def test_sql_on_the_watched_thread_is_counted_and_through_the_store_thread_is_not(db: StoreThread) -> None:
    """After watch_loop, a store call made directly on the loop's thread counts; the same call awaited does not."""

    async def main() -> tuple[int, int]:
        db.watch_loop()
        await db.list_models()
        through_thread = db.statements_on_loop
        db.store.list_models()  # the mistake the guard is for
        return through_thread, db.statements_on_loop

    through_thread, direct = asyncio.run(main())
    assert through_thread == 0 and direct >= 1


def test_a_queued_write_a_deposed_leader_makes_is_a_warning_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """A fenced write is the lease doing its job: one WARNING with the sentence, no traceback; anything else
    that fails a queued write stays an ERROR with its traceback."""
    import concurrent.futures

    from llmgw.control.store import offloop
    from llmgw.control.store.base import Fenced

    fenced: concurrent.futures.Future[None] = concurrent.futures.Future()
    fenced.set_exception(Fenced("this control plane led at term 1 and the lease is now held by b at term 2"))
    broken: concurrent.futures.Future[None] = concurrent.futures.Future()
    broken.set_exception(ValueError("a bug"))
    ended: concurrent.futures.Future[None] = concurrent.futures.Future()  # PostgreSQL ended the session mid-write
    ended.set_exception(sa.exc.OperationalError("UPDATE ...", {}, psycopg.errors.AdminShutdown(
        "terminating connection due to administrator command")))
    other_db: concurrent.futures.Future[None] = concurrent.futures.Future()
    other_db.set_exception(sa.exc.OperationalError("UPDATE ...", {}, psycopg.errors.DiskFull("no space left")))
    with caplog.at_level("WARNING", logger=offloop.log.name):
        offloop._log_failure(fenced)
        offloop._log_failure(broken)
        offloop._log_failure(ended)
        offloop._log_failure(other_db)
    (warned, failed, lost, failed_db) = caplog.records
    assert warned.levelname == "WARNING" and "term 2" in warned.getMessage() and warned.exc_info is None
    assert failed.levelname == "ERROR" and failed.exc_info is not None
    assert lost.levelname == "WARNING" and "administrator command" in lost.getMessage() and lost.exc_info is None
    assert failed_db.levelname == "ERROR" and failed_db.exc_info is not None
