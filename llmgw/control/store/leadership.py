"""The store's leader lease (the fencing token) and the control plane instances' heartbeats."""

from __future__ import annotations

import dataclasses
import logging

import sqlalchemy as sa
from sqlalchemy.orm import Session

from llmgw.control.store.base import StoreBase
from llmgw.control.store.tables import ControlPlaneRow, LeaseRow

log = logging.getLogger(__name__)

#: The sessions that keep a takeover waiting: a lock on the lease table that blocks an UPDATE of its row (a fenced
#: write's FOR SHARE is a RowShareLock; a read's AccessShareLock blocks nothing), held by a client that has sent
#: nothing in its transaction for longer than a lease (a leader stopped or frozen mid-write).
_STALLED = sa.text("""
    SELECT DISTINCT a.pid, a.application_name, host(a.client_addr) AS addr
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.relation = CAST(:table AS regclass) AND l.granted
      AND l.mode <> 'AccessShareLock' AND a.pid <> pg_backend_pid()
      AND a.state LIKE 'idle in transaction%' AND a.state_change < now() - make_interval(secs => :idle_s)
""")


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """The leader lease as stored: who holds it, its term (the fencing token), until when, and where it serves."""

    holder: str
    term: int
    expires_at: float
    renewed_at: float
    address: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class StoredControlPlane:
    """A control plane instance as it last wrote itself; its role comes from the lease."""

    id: str
    http_url: str
    agent_addr: str
    version: str
    started_at: float
    last_seen: float



class LeadershipStore(StoreBase):
    """Who leads (the lease) and which instances are alive (``llmgw get controlplanes``)."""

    # PostgreSQL, without SELECT ... FOR UPDATE (which SQLite lacks): the WHERE clause is the check. None
    # of these is fenced: they are how the fence moves.
    def get_lease(self, name: str = "leader") -> Lease | None:
        with self._session() as s:
            r = s.get(LeaseRow, name)
            return None if r is None else Lease(r.holder, r.term, r.expires_at, r.renewed_at, r.address)

    def take_lease(self, holder: str, *, now: float, lease_s: float, address: str = "", term: int = 0,
                   name: str = "leader") -> Lease | None:
        """Renews the lease (``term`` given: only if ``holder`` still holds it at that term) or takes it
        (``term`` 0: when nobody holds it, it expired, or ``holder`` itself held it before a restart; the term
        goes up by one, so every taking is a new fencing token). None when refused.

        ``now`` is the database's clock (``db_now``) for every server, so expiry never compares two
        machines' clocks.
        """
        if term:
            with self._session.begin() as s:
                renewed = s.execute(sa.update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder,
                                                              LeaseRow.term == term)
                                    .values(expires_at=now + lease_s, renewed_at=now, address=address)).rowcount
            return self.get_lease(name) if renewed else None
        current = self.get_lease(name)
        if current is None:
            try:
                with self._session.begin() as s:
                    s.add(LeaseRow(name=name, holder=holder, term=1, expires_at=now + lease_s, renewed_at=now,
                                   address=address))
            except sa.exc.IntegrityError:  # another server made the row first: it holds the lease
                return None
        elif current.expires_at > now and current.holder != holder:
            return None
        else:
            with self._session.begin() as s:
                if s.get_bind().dialect.name == "postgresql":
                    self._end_stalled_holders(s, lease_s=lease_s)
                    # Whatever still holds the row waits this long at most: a refusal, retried next round, and
                    # never a lease thread stuck behind a lock.
                    s.execute(sa.select(sa.func.set_config("lock_timeout", f"{max(100, int(lease_s * 500))}ms",
                                                           True)))
                # The term seen is part of the condition: of two servers taking one expired lease, the
                # second finds the term moved on and takes nothing.
                took = s.execute(sa.update(LeaseRow).where(LeaseRow.name == name, LeaseRow.term == current.term,
                                                           LeaseRow.holder == current.holder)
                                 .values(holder=holder, term=current.term + 1, expires_at=now + lease_s,
                                         renewed_at=now, address=address)).rowcount
            if not took:
                return None
        lease = self.get_lease(name)
        return lease if lease is not None and lease.holder == holder else None

    def _end_stalled_holders(self, s: Session, *, lease_s: float) -> None:
        """PostgreSQL: ends the sessions idle in a transaction for longer than a lease that hold the lease table.

        Every fenced write reads the lease row FOR SHARE, so that a takeover waits for the writes of the term it
        ends. A leader stopped (SIGSTOP, a frozen VM) inside such a write would make that wait last until it
        woke, or until TCP gave up on it (hours): the lease it has let expire would still keep every standby
        out. Its transaction can no longer commit anything of use (the lease is gone), so the standby ends it.
        """
        for pid, app, addr in s.execute(_STALLED, {"table": LeaseRow.__tablename__, "idle_s": lease_s}).all():
            try:
                with s.begin_nested():
                    ended = s.execute(sa.select(sa.func.pg_terminate_backend(pid))).scalar()
            except sa.exc.DBAPIError as e:
                ended = False
                log.warning("could not end database session %s (%s), which holds the expired lease's row while "
                            "idle in a transaction: %s; grant this control plane's database role pg_signal_backend",
                            pid, app or addr or "unknown client", str(e.orig).splitlines()[0] if e.orig else e)
            if ended:
                log.warning("ended database session %s (%s): it held the expired lease's row idle in a transaction "
                            "for over %gs (a leader stopped mid-write), which kept the takeover waiting",
                            pid, app or addr or "unknown client", lease_s)

    def release_lease(self, holder: str, *, term: int, now: float, name: str = "leader") -> bool:
        """Ends the holder's lease at once (a clean stop), so a standby takes over without waiting it out."""
        with self._session.begin() as s:
            return bool(s.execute(sa.update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder,
                                                            LeaseRow.term == term)
                                  .values(expires_at=now)).rowcount)

    # -- control plane instances (llmgw get controlplanes) ---------------------------------
    def beat_controlplane(self, cp: StoredControlPlane) -> None:
        """Creates or refreshes an instance's row (unfenced: a standby says it is alive too)."""
        with self._session.begin() as s:
            row = s.get(ControlPlaneRow, cp.id)
            if row is None:
                row = ControlPlaneRow(id=cp.id, started_at=cp.started_at)
                s.add(row)
            row.http_url, row.agent_addr = cp.http_url[:320], cp.agent_addr[:320]
            row.version, row.started_at, row.last_seen = cp.version[:64], cp.started_at, cp.last_seen

    def list_controlplanes(self) -> list[StoredControlPlane]:
        with self._session() as s:
            return [StoredControlPlane(r.id, r.http_url, r.agent_addr, r.version, r.started_at, r.last_seen)
                    for r in s.scalars(sa.select(ControlPlaneRow).order_by(ControlPlaneRow.id))]

    def forget_controlplanes(self, *, unseen_since: float) -> int:
        """Drops instances silent since before ``unseen_since`` (stopped for good); returns how many."""
        with self._session.begin() as s:
            return int(s.execute(sa.delete(ControlPlaneRow).where(ControlPlaneRow.last_seen < unseen_since))
                       .rowcount)
