"""A leader stopped inside a fenced write keeps no standby out once its lease has expired (real PostgreSQL).

Every fenced write reads the lease row FOR SHARE, so a takeover waits for the writes of the term it ends. Found
by CI (tests/e2e/test_previous_release_beside.py): a leader SIGSTOPped inside such a write kept the standby's
takeover UPDATE waiting until the leader was resumed, 30 s later; a frozen VM would have kept it out for hours.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from llmgw.control.store.leadership import Lease
from llmgw.control.store.store import Store
from llmgw.testing.postgres import Postgres

LEASE_S = 1.0


@pytest.fixture
def url(pg: Postgres, request: pytest.FixtureRequest) -> str:
    return pg.create_database("stalled_" + request.node.name[-12:].strip("_[]").replace("-", "_"))


@pytest.fixture
def stores(url: str) -> Iterator[tuple[Store, Store]]:
    first, second = Store.open_url(url), Store.open_url(url)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _take_within(store: Store, holder: str, seconds: float) -> tuple[Lease | None, BaseException | None]:
    """``store.take_lease`` in a thread, so that a takeover stuck on a lock fails the test instead of hanging it."""
    out: dict[str, object] = {}

    def take() -> None:
        try:
            out["lease"] = store.take_lease(holder, now=store.db_now(), lease_s=LEASE_S)
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            out["error"] = e

    t = threading.Thread(target=take, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"the takeover still waits after {seconds}s"
    return out.get("lease"), out.get("error")  # type: ignore[return-value]


def _holding_the_row(url: str) -> tuple[sa.Engine, sa.Connection]:
    """A connection inside a transaction that read the lease row FOR SHARE, as a fenced write does, then stopped."""
    engine = sa.create_engine(url)
    conn = engine.connect()
    conn.begin()
    assert conn.execute(sa.text("SELECT term FROM leases WHERE name = 'leader' FOR SHARE")).scalar_one() == 1
    return engine, conn


def _alive(conn: sa.Connection) -> bool:
    try:
        conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError:
        return False
    return True


def test_a_holder_stalled_for_longer_than_the_lease_is_ended_and_the_standby_leads(
        url: str, stores: tuple[Store, Store]) -> None:
    leader, standby = stores
    assert leader.take_lease("cp-a", now=leader.db_now(), lease_s=LEASE_S) is not None
    engine, stalled = _holding_the_row(url)
    try:
        time.sleep(LEASE_S + 0.5)  # the lease expires with the write still open
        lease, error = _take_within(standby, "cp-b", 10 * LEASE_S)
        assert error is None, error
        assert lease is not None and lease.holder == "cp-b" and lease.term == 2
        assert not _alive(stalled)  # its transaction was rolled back: nothing of the old term commits
    finally:
        stalled.close()
        engine.dispose()


def test_a_holder_inside_a_short_write_is_waited_for_not_ended(url: str, stores: tuple[Store, Store]) -> None:
    """A write begun just now (idle in its transaction for less than a lease) is a live leader's: the takeover
    waits for it a bounded time and is refused, and the write's session lives on."""
    leader, standby = stores
    assert leader.take_lease("cp-a", now=leader.db_now(), lease_s=LEASE_S) is not None
    time.sleep(LEASE_S + 0.2)  # expired before the write began
    engine, writing = _holding_the_row(url)
    try:
        lease, error = _take_within(standby, "cp-b", 10 * LEASE_S)
        assert lease is None
        assert isinstance(error, sa.exc.OperationalError) and "lock timeout" in str(error)
        assert _alive(writing)
        writing.rollback()
        lease, error = _take_within(standby, "cp-b", 10 * LEASE_S)  # the next round, once it committed
        assert error is None and lease is not None and lease.holder == "cp-b" and lease.term == 2
    finally:
        writing.close()
        engine.dispose()


def test_a_server_stopped_mid_write_is_ended_by_postgresql_itself(url: str) -> None:
    """A server's own sessions carry an idle-in-transaction timeout (``llmgw server`` sets two leases, 10 s at
    least), so a standby of an earlier release, which ends nothing, is not kept out either."""
    store = Store.open_url(url, idle_tx_timeout_s=0.5)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "500ms"
            conn.execute(sa.text("SELECT 1"))  # inside the transaction SQLAlchemy began
            time.sleep(1.5)
            assert not _alive(conn)
        with store.engine.connect() as conn:  # the pool's next connection works, with the same setting
            assert conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "500ms"
    finally:
        store.close()
    assert _default_is_unbounded(url)


def _default_is_unbounded(url: str) -> bool:
    """Without the option (the CLI, a restore), a long transaction is left alone."""
    store = Store.open_url(url)
    try:
        with store.engine.connect() as conn:
            return conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar_one() == "0"
    finally:
        store.close()
