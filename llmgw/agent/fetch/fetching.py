"""The agent's fetcher: one owner of the weights cache and of every download into it.

``ensure`` turns a remote source into a complete, verified local path. Per source (its cache name) there
is at most one download in flight: a second caller joins it and hears its progress, so eight shards
wanting one model cost one download. Each download is planned (files, sizes, sha256), checked against the
free disk minus what other downloads in flight still need, fetched file by file into
``<cache>/.partial/<name>/files/`` with a sidecar that lets a restarted agent resume with Range, verified
(size always, sha256 where known), and only then renamed into ``<cache>/<name>`` in one step and recorded
in ``.llmgw-fetched.json``. Nothing under ``.partial`` is ever returned, so a partial or corrupt file is
never used or reported as present.

A caller that goes away leaves the download to the others; when the last one goes (the agent stopping,
the shard stopped), the download is cancelled and its partial bytes kept for the next ``ensure``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from llmgw.agent import sourcepaths, weights
from llmgw.agent.fetch import guard, records, transfer
from llmgw.agent.fetch import ledger as ledger_mod
from llmgw.agent.fetch import meter as meter_mod
from llmgw.agent.fetch import plan as plan_mod
from llmgw.agent.fetch.partial import Sidecar, Sink
from llmgw.core import errors, netpolicy, sources

log = logging.getLogger(__name__)

PARTIAL = ".partial"
_GIB = 1 << 30


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding ``path`` (for an unprivileged process)."""
    return shutil.disk_usage(path).free


@dataclasses.dataclass(eq=False)
class _Flight:
    meter: meter_mod.Meter
    task: asyncio.Task[str] | None = None
    waiters: int = 0
    planned: bool = False
    abandoned: bool = False   # cancelled because nobody waits any more; a new caller starts a new flight

    def remaining(self) -> int:
        """Bytes this download still has to write: what the disk check promises it."""
        return max(0, self.meter.total - self.meter.done) if self.planned else 0


class _Corrupt(errors.FetchError):
    """A file came out different from what was asked: its partial download is thrown away."""


class Fetcher:
    """Fetches remote weights into ``cache_dir``, once per source at a time, and removes only what it fetched."""

    def __init__(self, cache_dir: Path, *, stall_s: float = 30.0, progress_period_s: float = 1.0,
                 max_attempts: int = 6, retry_base_s: float = 1.0, retry_cap_s: float = 30.0,
                 parallel_files: int = 4, free_bytes: Callable[[Path], int] = free_bytes,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 policy: netpolicy.Policy | None = None, source_roots: sourcepaths.Roots | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """``tls``: what https:// fetches verify with (``trust.context``: the system's authorities and the cluster
        CA, so the server's own mirror and hub over TLS verify); None: the system's alone."""
        self.cache_dir = Path(cache_dir)
        self._tls = tls
        # Who may be fetched from (``guard``): by default no loopback, link-local or own address; the
        # cluster's endpoints each request names are trusted as they arrive (they come from the control plane).
        self._policy = policy or netpolicy.Policy.of(False, setting=guard.SETTING)
        # A local source is resolved only under these (``sourcepaths``): the node's weights directories.
        self._roots = source_roots or sourcepaths.Roots((self.cache_dir,))
        self._connector: guard.Connector | None = None
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._stall_s = stall_s
        self._period_s = progress_period_s
        self._max_attempts = max_attempts
        self._retry_base_s = retry_base_s
        self._retry_cap_s = retry_cap_s
        self._parallel = max(1, parallel_files)
        self._free_bytes = free_bytes
        self._clock = clock
        self._wall = wall
        self._ledger = ledger_mod.Ledger(self.cache_dir)
        self._flights: dict[str, _Flight] = {}
        self._session: aiohttp.ClientSession | None = None
        for trash in (self.cache_dir / PARTIAL).glob(".trash-*"):
            shutil.rmtree(trash, ignore_errors=True)   # a removal the last agent did not finish

    async def close(self) -> None:
        """Cancel the downloads in flight (their partial bytes stay for the next agent) and close the client."""
        tasks = [f.task for f in self._flights.values() if f.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def held(self) -> list[records.Held]:
        """What llmgw fetched and the cache still holds, for the inventory."""
        return self._ledger.held()

    def remove(self, name: str) -> None:
        """Delete the entry ``name`` if llmgw fetched it; FetchError (logged, nothing touched) otherwise."""
        if name in self._flights:
            raise errors.FetchError(f"refused to remove {name!r}: it is being fetched; stop the shards that want it")
        path = self._ledger.removable(name)
        if not path.exists():
            self._ledger.drop(name)
            return
        # Renamed out of sight first: a crash mid-delete leaves a trash folder (cleared at start), never a
        # half-deleted model under its real name that the next ensure would take for complete.
        (self.cache_dir / PARTIAL).mkdir(exist_ok=True)
        trash = self.cache_dir / PARTIAL / f".trash-{name}"
        shutil.rmtree(trash, ignore_errors=True)
        os.rename(path, trash)
        self._ledger.drop(name)
        shutil.rmtree(trash, ignore_errors=True)
        log.info("removed weights %s from %s", name, self.cache_dir)

    async def ensure(self, req: records.Request, *,
                     on_progress: Callable[[records.Progress], None] | None = None) -> str:
        """Local path (file or directory) of the complete, verified weights ``req`` names; FetchError otherwise.

        Concurrent callers for one source share one download and all get its progress.
        """
        src = req.source
        if not src.remote:
            try:
                return await asyncio.to_thread(weights.resolve_source, src.text, roots=self._roots) or ""
            except errors.EngineError as exc:
                raise errors.FetchError(str(exc)) from None
        if req.file:
            try:
                src = sources.with_file(src, req.file)
            except sources.SourceError as exc:
                raise errors.FetchError(str(exc)) from None
            req = dataclasses.replace(req, source=src, file="")
        if req.endpoint:
            self._trust(req.endpoint)
        name = src.cache_name()
        found = self._present(name)
        if found is not None:
            self._ledger.touch(name, now=self._wall())
            if on_progress is not None:
                size = sum(h.size_bytes for h in self._ledger.held() if h.name == name)
                on_progress(records.Progress(done_bytes=size, total_bytes=size, rate_bps=0.0, eta_s=0.0, state="done"))
            return found
        flight = self._flights.get(name)
        while flight is not None and flight.abandoned:
            # Its last caller went away and it is stopping: joining it would hand this caller its CancelledError.
            assert flight.task is not None
            await asyncio.wait([flight.task])
            flight = self._flights.get(name)
        if flight is None:
            flight = _Flight(meter=meter_mod.Meter(clock=self._clock, period_s=self._period_s))
            flight.task = asyncio.create_task(self._fetch(name, req, flight), name=f"fetch {name}")
            self._flights[name] = flight
            flight.task.add_done_callback(lambda t, n=name, f=flight: self._landed(n, f, t))
        assert flight.task is not None
        flight.meter.subscribe(on_progress)
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        except asyncio.CancelledError:
            if flight.waiters == 1 and not flight.task.done():
                flight.abandoned = True
                flight.task.cancel()   # the last one waiting went away: stop, keep the partial bytes
            raise
        finally:
            flight.waiters -= 1
            flight.meter.unsubscribe(on_progress)

    def _landed(self, name: str, flight: _Flight, task: asyncio.Task[str]) -> None:
        if self._flights.get(name) is flight:
            del self._flights[name]
        if not task.cancelled():
            task.exception()   # retrieved here, so one failing with nobody left waiting is not logged as lost

    def _present(self, name: str) -> str | None:
        """The path of a complete entry for ``name``, None when there is none; FetchError for a stranger's."""
        path = self.cache_dir / name
        entry = self._ledger.get(name)
        if entry is None and (path.exists() or path.is_symlink()):
            if not self._adopt(name, path):
                raise errors.FetchError(f"{path} exists but llmgw did not fetch it (it is not in "
                                        f"{self._ledger.path}); move it away, or name it as the source with "
                                        f"file://{path}") from None
            entry = self._ledger.get(name)
        if entry is not None and (path.is_symlink() or (path.exists() and not path.is_dir())):
            raise errors.FetchError(f"{path} is recorded as fetched by llmgw but is now a symlink or a file, not "
                                    "what llmgw put there; move it away and fetch again")
        if entry is None or not path.is_dir():
            return None
        rel = str(entry.get("rel", ""))
        return str(path / rel) if rel else str(path)

    def _adopt(self, name: str, path: Path) -> bool:
        """Record an entry whose download was verified and renamed just before the last agent stopped."""
        try:
            doc = json.loads((self.cache_dir / PARTIAL / name / "sidecar.json").read_text())
        except (OSError, ValueError):
            return False
        if not (isinstance(doc, dict) and doc.get("verified") and path.is_dir() and not path.is_symlink()):
            return False
        size = sum(int(f.get("size", 0)) for f in doc.get("files", {}).values())
        self._ledger.add(name, source=str(doc.get("source", "")), rel=str(doc.get("rel", "")), size_bytes=size,
                         now=self._wall())
        shutil.rmtree(self.cache_dir / PARTIAL / name, ignore_errors=True)
        return True

    def _trust(self, endpoint: str) -> None:
        """Trust the cluster's endpoint ``endpoint`` (the control plane named it, not an operator's spec)."""
        self._policy = self._policy.trusting(endpoint)
        if self._connector is not None:
            self._connector.policy = self._policy

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._connector = guard.Connector(self._policy, ssl=self._tls if self._tls is not None else True)
            # No decompression: the bytes on disk must be the file's, or size and sha256 cannot agree.
            self._session = aiohttp.ClientSession(
                connector=self._connector, auto_decompress=False, read_bufsize=1 << 22,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._stall_s))
        return self._session

    async def _fetch(self, name: str, req: records.Request, flight: _Flight) -> str:
        meter = flight.meter
        partial = self.cache_dir / PARTIAL / name
        try:
            plan = await self._retrying(lambda: plan_mod.make(self._http(), req, timeout_s=self._stall_s),
                                        meter, what=req.source.text)
            files = partial / "files"
            files.mkdir(parents=True, exist_ok=True)
            side = Sidecar(partial / "sidecar.json", req.source.text)
            have = self._keep_partials(files, plan, side)
            total = sum(j.size for j in plan.jobs)
            self._check_disk(name, total - have)
            flight.planned = True
            meter.start(total=total, done=have)
            log.info("fetching %s into %s: %d files, %.2f GiB%s%s", req.source.text, name, len(plan.jobs),
                     total / _GIB, f", resuming at {have / _GIB:.2f} GiB" if have else "",
                     f" ({plan.note})" if plan.note else "")
            await self._all(plan.jobs, files, side, meter, hub=req.source.kind == "hf",
                            on_size=lambda n: self._check_disk(name, n))
            meter.set_state("verifying")
            side.verified, side.rel = True, plan.rel
            side.save()
            target = self.cache_dir / name
            if target.exists() or target.is_symlink():
                raise errors.FetchError(f"{target} appeared while it was being fetched, not put there by llmgw; "
                                        "move it away and fetch again")
            os.rename(files, target)
            size = sum(j.size for j in plan.jobs)
            self._ledger.add(name, source=req.source.text, rel=plan.rel, size_bytes=size, now=self._wall())
            shutil.rmtree(partial, ignore_errors=True)
            meter.set_state("done")
            log.info("fetched %s into %s (%.2f GiB)", req.source.text, name, size / _GIB)
            return str(target / plan.rel) if plan.rel else str(target)
        except errors.FetchError as exc:
            if isinstance(exc, _Corrupt):
                shutil.rmtree(partial, ignore_errors=True)
            log.warning("fetch of %s failed: %s", req.source.text, exc)
            meter.set_state("failed", str(exc))
            raise

    def _keep_partials(self, files: Path, plan: plan_mod.Plan, side: Sidecar) -> int:
        """Keep the partial bytes the sidecar vouches for; delete the rest. Returns the bytes kept."""
        wanted = {j.rel for j in plan.jobs}
        for p in sorted(files.rglob("*"), reverse=True):
            rel = p.relative_to(files).as_posix()
            if p.is_file() and rel not in wanted:
                p.unlink()
        have = 0
        for job in plan.jobs:
            p = files / job.rel
            if p.exists() and not side.keeps(job):
                p.unlink()
                side.files.pop(job.rel, None)
            elif p.exists():
                have += p.stat().st_size
                job.size = job.size or int(side.files[job.rel].get("size") or 0)
        for rel in list(side.files):
            if rel not in wanted:
                del side.files[rel]
        side.save()
        return have

    def _check_disk(self, name: str, need: int) -> None:
        free = self._free_bytes(self.cache_dir)
        promised = sum(f.remaining() for n, f in self._flights.items() if n != name)
        if need > free - promised:
            extra = f", and {promised / _GIB:.1f} GiB of it is promised to fetches in flight" if promised else ""
            raise errors.FetchError(f"needs {need / _GIB:.1f} GiB, {self.cache_dir} has {free / _GIB:.1f} GiB "
                                    f"free{extra}; free space there, or remove weights no model uses")

    async def _all(self, jobs: list[records.FileJob], files: Path, side: Sidecar,
                   meter: meter_mod.Meter, *, hub: bool, on_size: Callable[[int], None]) -> None:
        gate = asyncio.Semaphore(self._parallel)

        async def one(job: records.FileJob) -> None:
            async with gate:
                await self._file(job, files, side, meter, hub=hub, on_size=on_size)

        tasks = [asyncio.create_task(one(j)) for j in jobs]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            # One file failed (or the fetch was cancelled): stop the others before anyone touches the directory.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _file(self, job: records.FileJob, files: Path, side: Sidecar, meter: meter_mod.Meter, *,
                    hub: bool, on_size: Callable[[int], None]) -> None:
        try:
            sink = Sink(files / job.rel, want_hash=bool(job.sha256))
        except OSError as exc:
            raise errors.FetchError(f"cannot write {files / job.rel}: {exc}; check the weights directory") from None
        try:
            try:
                await self._retrying(lambda: transfer.attempt(job, sink, side, meter=meter, stall_s=self._stall_s,
                                                              hub=hub, policy=self._policy, on_size=on_size,
                                                              tls=self._tls),
                                     meter, what=job.url, progressed=lambda: sink.size)
            except OSError as exc:
                # A full or failing disk: the partial bytes stay (the next ensure resumes once there is room).
                raise errors.FetchError(f"cannot write {sink.path}: {exc}; free space in {self.cache_dir} or "
                                        "check the disk, then fetch again") from None
            if job.size and sink.size != job.size:
                raise _Corrupt(f"{job.url}: got {sink.size} bytes, expected {job.size}; the partial download "
                               "was discarded; fetch again")
            if job.sha256:
                got = await asyncio.to_thread(sink.hexdigest)
                if got != job.sha256:
                    raise _Corrupt(f"{job.url}: sha256 mismatch: expected {job.sha256}, got {got}; the download "
                                   "was discarded. Check spec.source_sha256, or whether the file changed upstream")
        finally:
            sink.close()

    async def _retrying(self, call: Callable[[], object], meter: meter_mod.Meter, *, what: str,
                        progressed: Callable[[], int] = lambda: 0) -> plan_mod.Plan:
        """Run ``call`` until it stops raising Retry; attempts count only while no byte arrives between them."""
        attempts = 0
        while True:
            before = progressed()
            try:
                return await call()  # type: ignore[misc, no-any-return]
            except transfer.Retry as exc:
                attempts = 1 if progressed() > before else attempts + 1
                if attempts >= self._max_attempts:
                    raise errors.FetchError(f"{what}: {exc}; gave up after {attempts} attempts in a row without "
                                            "progress; check the server and the network, then fetch again") from None
                delay = min(self._retry_base_s * 2 ** (attempts - 1), self._retry_cap_s)
                log.warning("fetch of %s: %s; retrying in %.1f s", what, exc, delay)
                meter.set_state("stalled", f"{exc}; retrying in {delay:g} s (attempt {attempts + 1} of "
                                           f"{self._max_attempts})")
                await asyncio.sleep(delay)

