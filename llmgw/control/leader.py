"""Leader election: one control plane leads by holding the lease row, the others stand by.

Every instance runs ``Leadership.run``. A standby tries to take the lease each ``renew_s``
(it succeeds once the row is free or expired); the leader renews it each ``renew_s``. The
term the lease carries is the fencing token: it rises at every taking, the store refuses a
write whose transaction does not find this instance's term in the row (``Store.fence``), and
every command to an agent carries it (agents refuse older terms).

Why a lease row and not ``pg_try_advisory_lock``: an advisory lock belongs to one database
session, so it goes with the connection, not with the process's ability to act. A leader
whose connection survives while the process is paused (SIGSTOP, a VM frozen for migration)
still holds it, and one whose connection drops for a moment (PostgreSQL restarted, a NAT
timeout) loses it at once, though nothing else changed; neither gives a number a write can be
checked against afterwards. The row gives a term that fences every write and command, works the
same on SQLite, and says who leads and where to anyone who reads it (``llmgw get controlplanes``,
a standby redirecting an agent).

Timing, all lease times on the database's clock (``Store.db_now``), so two servers' clocks
are never compared with each other:

- the lease lasts ``lease_s`` from a renewal that began at local monotonic time ``t0``;
- the leader stops acting (no command sent, no write let through) once ``t0`` is more than
  ``lease_s - margin_s`` ago without a newer renewal: before any standby can see it expired,
  as long as the leader's clock and the database's advance at rates within ``margin_s/lease_s``
  of each other (1.5 s in 6 s: 25 %, far beyond any real clock's drift);
- a standby takes the lease at most ``renew_s`` after it expired.

So with the defaults (6 s, renewals every 1 s) a leader that dies is replaced 5-7 s later, and
the database can be away for up to 4.5 s without a leader giving up. Whatever the timings, the
fence keeps a leader that was paused past all of this from writing: it wakes, its first write
is refused, and it steps down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import pathlib
import secrets
import socket
import time
from collections.abc import Awaitable, Callable

from llmgw.control.store import store as store_mod
from llmgw.control.store.store import Lease, Store, StoredControlPlane
from llmgw.core.errors import LlmgwError

log = logging.getLogger(__name__)
#: The file in the data directory that keeps an instance's id across restarts: a restarted leader
#: takes its own lease back at once (with a new term) instead of waiting for it to expire.
INSTANCE_FILE = "instance-id"


@dataclasses.dataclass(frozen=True, slots=True)
class Timing:
    #: How long a lease lasts past its last renewal.
    lease_s: float = 6.0
    #: How often the leader renews and a standby tries to take it.
    renew_s: float = 1.0
    #: The leader stops acting this long before its lease could have expired anywhere.
    margin_s: float = 1.5

    def check(self) -> None:
        """LlmgwError unless a leader renews at least twice before it must stop acting."""
        if not (self.lease_s > 0 and self.renew_s > 0 and self.margin_s > 0):
            raise LlmgwError("--lease, --lease-renew and the margin must be positive")
        if self.lease_s - self.margin_s < 2 * self.renew_s:
            raise LlmgwError(f"--lease {self.lease_s:g}s leaves {self.lease_s - self.margin_s:g}s to act after a "
                             f"renewal, less than two renewals every {self.renew_s:g}s: one slow renewal would "
                             "depose the leader. Make --lease longer or --lease-renew shorter (e.g. --lease "
                             f"{2 * self.renew_s + self.margin_s + 1:g})")


#: The fast settings the failover bench measures (bench/failover.py): a dead leader replaced within ~3 s.
FAST = Timing(lease_s=2.0, renew_s=0.25, margin_s=0.5)


@dataclasses.dataclass(frozen=True, slots=True)
class Me:
    """This instance: its id (the lease's holder when it leads) and where it serves."""

    id: str
    http_url: str
    agent_addr: str
    version: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Instance:
    """One control plane as ``llmgw get controlplanes`` lists it."""

    id: str
    role: str  # leader, standby, or gone (not seen for three leases)
    term: int  # the leader's term; 0 for the others
    lease_age_s: float  # since the leader's last renewal (-1: not the leader)
    http_url: str
    agent_addr: str
    version: str
    last_seen_s: float  # seconds since it last wrote its row


def instance_id(data_dir: pathlib.Path) -> str:
    """This data directory's instance id, made once (``host-xxxxxxxx``) and kept in ``instance-id``."""
    path = data_dir / INSTANCE_FILE
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found[:64]
    made = f"{socket.gethostname()[:40]}-{secrets.token_hex(4)}"
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(made + "\n")
    return made


class Leadership:
    """Takes, renews and gives up the lease; tells the rest of the server through two callbacks."""

    def __init__(self, store: Store, me: Me, *, timing: Timing = Timing(),
                 on_elected: Callable[[int], Awaitable[None]], on_deposed: Callable[[str], Awaitable[None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        timing.check()
        self.store, self.me, self.timing, self.clock = store, me, timing, clock
        self._on_elected, self._on_deposed = on_elected, on_deposed
        self.leading = False
        self.term = 0
        #: Local monotonic time at which the last successful renewal (or the taking) began.
        self._renewed_from = 0.0
        #: The lease and the instances as last read (for redirects and ``llmgw get controlplanes``).
        self.lease: Lease | None = None
        self._lease_read_at = 0.0  # database clock
        self.instances: list[StoredControlPlane] = []
        self._started_at = 0.0
        self._wake = asyncio.Event()
        #: Set once the first round is over (this instance leads, or knows it stands by, or the database
        #: did not answer): the server answers its first request after it, not with a 503 before.
        self.settled = asyncio.Event()
        self._stopped = False
        #: The lease's statements run here, never behind the store thread's queue nor in the loop's
        #: default executor: a database that hangs must not delay a renewal nor starve other threads.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="llmgw-lease")
        self._outage_since = 0.0
        store.fence = store_mod.STANDBY

    # -- what the rest of the server asks ---------------------------------------------
    def valid(self) -> bool:
        """Whether this instance may act as leader now: it leads and its last renewal is recent enough."""
        return self.leading and self.clock() - self._renewed_from < self.timing.lease_s - self.timing.margin_s

    def leader(self) -> StoredControlPlane | None:
        """The leader as last read (None: nobody holds an unexpired lease, or it is this instance)."""
        lease = self.lease
        if lease is None or self.leading or lease.expires_at <= self._lease_read_at:
            return None
        return next((cp for cp in self.instances if cp.id == lease.holder), None)

    def peers(self) -> tuple[str, ...]:
        """Every live instance's agent address (this one's included), for agents to rotate through."""
        live = [cp.agent_addr for cp in self.instances
                if cp.agent_addr and self._lease_read_at - cp.last_seen < 3 * self.timing.lease_s]
        return tuple(dict.fromkeys([self.me.agent_addr, *live]))

    def describe(self) -> list[Instance]:
        """Every instance as last read: role, term, lease age, addresses, version."""
        now, lease = self._lease_read_at, self.lease
        out = []
        for cp in self.instances:
            held = lease is not None and lease.holder == cp.id and lease.expires_at > now
            silent = now - cp.last_seen
            role = "leader" if held else "gone" if silent > 3 * self.timing.lease_s else "standby"
            out.append(Instance(cp.id, role, lease.term if held and lease else 0,
                                round(now - lease.renewed_at, 3) if held and lease else -1.0,
                                cp.http_url, cp.agent_addr, cp.version, round(max(silent, 0.0), 3)))
        return out

    def kick(self) -> None:
        """Check the lease now (a write was refused as fenced: this instance may have been deposed)."""
        self._wake.set()

    # -- the loop ------------------------------------------------------------------
    def stop(self) -> None:
        """Ends ``run`` at its next step without giving the lease up (``release`` does that).

        A flag as well as the task's cancel: on Python 3.11 ``asyncio.wait_for`` drops a cancellation that
        arrives as its inner future completes (gh-86296), and the loop went on renewing (seen in a test
        that hung once in six).
        """
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopped:
            self._wake.clear()
            t0 = self.clock()
            try:
                await self._round(loop, t0)
                if self._outage_since:
                    log.info("the database answers again after %.1fs", self.clock() - self._outage_since)
                    self._outage_since = 0.0
            except Exception as e:  # noqa: BLE001 (a timeout, the database away, a refusal: all retried)
                if not self._outage_since:
                    self._outage_since = t0
                    log.warning("lease %s failed: %s", "renewal" if self.leading else "check",
                                str(e).splitlines()[0] if str(e) else type(e).__name__)
            self.settled.set()
            if self.leading and not self.valid():
                await self._depose(f"its lease was not renewed for {self.clock() - self._renewed_from:.1f}s "
                                   f"(lease {self.timing.lease_s:g}s; the database did not answer in time)")
            left = self.timing.renew_s - (self.clock() - t0)
            if left > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), left)
                except TimeoutError:
                    pass

    async def _round(self, loop: asyncio.AbstractEventLoop, t0: float) -> None:
        if self.leading:
            budget = max(0.05, self.timing.lease_s - self.timing.margin_s - (t0 - self._renewed_from))
            lease = await asyncio.wait_for(loop.run_in_executor(self._pool, self._renew), budget)
            if lease is None:
                await self._depose("another control plane took the lease")
            else:
                self._renewed_from = t0
        else:
            lease = await asyncio.wait_for(loop.run_in_executor(self._pool, self._try_take), self.timing.lease_s)
            if lease is not None and not self.leading:
                self._renewed_from = t0
                self.term, self.leading = lease.term, True
                self.store.fence = (self.me.id, lease.term)
                log.warning("this control plane (%s) now leads, term %d", self.me.id, lease.term)
                try:
                    await self._on_elected(lease.term)
                except Exception as e:  # noqa: BLE001 (taking over failed: give the lease back, try again)
                    log.exception("taking over as leader failed")
                    await self._depose(f"taking over failed: {e}")
        await asyncio.wait_for(loop.run_in_executor(self._pool, self._beat), self.timing.lease_s)

    def _renew(self) -> Lease | None:
        now = self.store.db_now()
        self._lease_read_at = now
        lease = self.store.take_lease(self.me.id, now=now, lease_s=self.timing.lease_s,
                                      address=self.me.agent_addr, term=self.term)
        self.lease = lease if lease is not None else self.store.get_lease()
        return lease

    def _try_take(self) -> Lease | None:
        now = self.store.db_now()
        self._lease_read_at = now
        lease = self.store.take_lease(self.me.id, now=now, lease_s=self.timing.lease_s,
                                      address=self.me.agent_addr)
        self.lease = lease if lease is not None else self.store.get_lease()
        return lease

    def _beat(self) -> None:
        now = self.store.db_now()
        if not self._started_at:
            self._started_at = now
        self.store.beat_controlplane(StoredControlPlane(self.me.id, self.me.http_url, self.me.agent_addr,
                                                        self.me.version, self._started_at, now))
        self.instances = self.store.list_controlplanes()
        self._lease_read_at = now

    async def _depose(self, reason: str) -> None:
        if not self.leading:
            return
        # The fence first: from here no write of this instance's goes through, whatever runs meanwhile.
        self.store.fence = store_mod.STANDBY
        self.leading = False
        log.error("this control plane (%s) no longer leads (term %d): %s; standing by", self.me.id, self.term, reason)
        await self._on_deposed(reason)

    async def release(self) -> None:
        """A clean stop: gives the lease up at once so a standby leads without waiting it out."""
        self.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not self.leading:
            return
        self.leading = False
        self.store.fence = store_mod.STANDBY
        try:
            await asyncio.to_thread(lambda: self.store.release_lease(self.me.id, term=self.term,
                                                                     now=self.store.db_now()))
        except Exception as e:  # noqa: BLE001 (it expires by itself)
            log.warning("could not release the lease (it expires in %gs by itself): %s", self.timing.lease_s, e)
