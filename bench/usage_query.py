"""``llmgw usage --by project --since 30d`` over 30 days of rollups for 100 keys × 20 models (goal: under 200 ms).

    .venv/bin/python bench/usage_query.py [--keep /tmp/usage-bench] [--minute-days 2] [--runs 21]

One SQLite store, filled straight into ``usage_rollups`` as the ingest would leave it: every key uses every
model, in 10 projects of 10 keys, each on one of 4 nodes; minute rows for the last ``--minute-days`` days,
hour rows and day rows for ``--days`` days (7.3 M rows with the defaults, about 3 GB; ``--keep DIR``
keeps the file for the next run, which then skips the fill). Then, for the 30-day view per project:

* **store**: ``Store.usage`` called directly (the SQL and the rows made into objects);
* **store, member**: the same for a user who sees one project (``projects_visible``);
* **REST**: ``GET /api/v1/usage?since=30d&by=project`` over HTTP to the real REST app (uvicorn on
  127.0.0.1, a real operator token), from a kept-alive client;
* **CLI**: ``llmgw usage --by project --since 30d -o json`` as a process against it (Python's own start-up
  and the CLI's imports included, which are most of it).

Each is run ``--runs`` times after one warm-up; the median, p90 and max are printed. The 7-day and 1-hour
views (hour and minute rows) are timed too, since they read the grains the 30-day view does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import uvicorn

from llmgw.control.auth import Auth, passwords, principals
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredUser
from llmgw.core import quota
from llmgw.testing.procs import free_port, wait_for

DAY, HOUR, MINUTE = 86400, 3600, 60
NODES = ("node1", "node2", "node3", "node4")
COLUMNS = ("grain", "start", "project", "key", "model", "user", "node", "requests", "errors", "prompt_tokens",
           "cached_tokens", "completion_tokens", "spend_micros", "ttft_ms_sum", "ttft_count", "duration_ms_sum",
           "ttft_hist")


def rows(grain: str, starts: range, keys: int, models: int, projects: int) -> Iterator[tuple[object, ...]]:
    """One row per bucket, key and model, with numbers that vary but cost nothing to make."""
    per_project = max(1, keys // projects)
    scale = {"m": 1, "h": 60, "d": 1440}[grain]
    n_hist = len(quota.TTFT_BUCKETS_MS) + 1
    hists = []
    for i in range(7):
        h = [0] * n_hist
        h[2 + i % 5], h[3 + i % 5] = 3 * scale, scale
        hists.append(json.dumps(h))
    for start in starts:
        for k in range(keys):
            project = f"project-{k // per_project:02d}"
            key = f"key-{k:03d}"
            node = NODES[k % len(NODES)]
            for m in range(models):
                r = 4 * scale
                prompt = (300 + (k * 7 + m * 13 + start // 60) % 500) * r
                yield (grain, start, project, key, f"model-{m:02d}", f"user-{k % 30:02d}", node, r, (k + m) % 3 == 0,
                       prompt, prompt // 4, prompt // 3, prompt // 2, 120.0 * r, r, 900.0 * r, hists[(k + m) % 7])


def fill(store: Store, *, now: int, days: int, minute_days: float, keys: int, models: int, projects: int) -> int:
    """Writes the rollups with SQLite's own executemany (the ORM would take an hour); returns the rows written."""
    today = now // DAY * DAY
    this_hour = now // HOUR * HOUR
    this_minute = now // MINUTE * MINUTE
    grains = (("d", range(today - (days - 1) * DAY, today + 1, DAY)),
              ("h", range(this_hour - days * 24 * HOUR + HOUR, this_hour + 1, HOUR)),
              ("m", range(this_minute - int(minute_days * DAY) + MINUTE, this_minute + 1, MINUTE)))
    sql = f"INSERT INTO usage_rollups ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    written = 0
    raw = store.engine.raw_connection()
    try:
        cur = raw.cursor()
        for grain, starts in grains:
            t0 = time.perf_counter()
            batch: list[tuple[object, ...]] = []
            for row in rows(grain, starts, keys, models, projects):
                batch.append(row)
                if len(batch) == 50_000:
                    cur.executemany(sql, batch)
                    written += len(batch)
                    batch.clear()
            cur.executemany(sql, batch)
            written += len(batch)
            raw.commit()
            print(f"  {grain}: {len(starts) * keys * models:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        raw.close()
    return written


class Server:
    """The REST app with real authentication, on uvicorn in a thread (as ``llmgw server`` serves it)."""

    def __init__(self, store: Store) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = StoreThread(store)
        self.auth = Auth(self.db)
        app = create_api(self.db, Cluster(store), auth=self.auth)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)
        self.thread.start()
        wait_for(lambda: _answers(self.url), timeout=30, what="REST app listening")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.db.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def timed(name: str, fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm-up: SQLite's pages in the OS cache, the first connection made
    ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1000)
    ms.sort()
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    print(f"{name:<44} median {statistics.median(ms):8.1f} ms   p90 {p90:8.1f} ms   max {ms[-1]:8.1f} ms", flush=True)
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--minute-days", type=float, default=2.0)
    ap.add_argument("--keys", type=int, default=100)
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--projects", type=int, default=10)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--cli-runs", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="a data directory kept (and reused when it holds a filled store)")
    args = ap.parse_args()

    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="usage-bench-")
    data = args.keep or Path(tmp.name)  # type: ignore[union-attr]
    data.mkdir(parents=True, exist_ok=True)
    marker = data / "filled.json"
    store = Store.open(data)
    try:
        if marker.exists():
            now = json.loads(marker.read_text())["now"]
            print(f"reusing the store in {data} (filled at {now})")
        else:
            now = int(time.time())
            print(f"filling {data}: {args.keys} keys x {args.models} models, {args.days} days of hour and day rows, "
                  f"{args.minute_days} days of minute rows", flush=True)
            t0 = time.perf_counter()
            n = fill(store, now=now, days=args.days, minute_days=args.minute_days, keys=args.keys,
                     models=args.models, projects=args.projects)
            marker.write_text(json.dumps({"now": now, "rows": n}))
            print(f"  {n:,} rows in {time.perf_counter() - t0:.0f} s", flush=True)
        size = sum(f.stat().st_size for f in data.glob("*.db*"))
        print(f"store: {size / 2**20:,.0f} MiB on disk\n")
        since30, since7, since1h = time.time() - 30 * DAY, time.time() - 7 * DAY, time.time() - HOUR
        view = store.usage(since30, by="project")
        print(f"30d by project: grain {view.grain}, {len(view.rows)} rows, "
              f"{sum(r.requests for r in view.rows):,} requests\n")
        timed("store  usage(30d, by=project)", lambda: store.usage(since30, by="project"), args.runs)
        timed("store  usage(30d, by=project), a member", lambda: store.usage(
            since30, by="project", projects_visible={"project-03"}), args.runs)
        timed("store  usage(30d, by=model)", lambda: store.usage(since30, by="model"), args.runs)
        timed("store  usage(7d, by=project) [hour rows]", lambda: store.usage(since7, by="project"), args.runs)
        timed("store  usage(1h, by=project) [minute rows]", lambda: store.usage(since1h, by="project"), args.runs)
        timed("store  time_series(30d, day, by=project)",
              lambda: store.time_series(since30, bucket="day", group_by="project"), args.runs)

        server = Server(store)
        try:
            store.put_user(StoredUser("ops", principals.OPERATOR, passwords.hash_password("pw"), 0.0))
            token, _ = asyncio.run(server.auth.issue(kind="user", subject="ops", ttl_s=3600))
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
                def rest() -> None:
                    resp = c.get("/api/v1/usage", params={"since": "30d", "by": "project"})
                    resp.raise_for_status()
                timed("REST   GET /api/v1/usage?since=30d&by=project", rest, args.runs)
            with tempfile.TemporaryDirectory() as home:
                env = {**os.environ, "LLMGW_URL": server.url, "LLMGW_TOKEN": token, "HOME": home}

                def cli() -> None:
                    subprocess.run([sys.executable, "-m", "llmgw", "usage", "--by", "project", "--since", "30d",
                                    "-o", "json"], env=env, check=True, capture_output=True, timeout=60)

                def python_start() -> None:
                    subprocess.run([sys.executable, "-c", "import llmgw.cli.main"], env=env, check=True,
                                   capture_output=True, timeout=60)
                timed("CLI    llmgw usage --by project --since 30d", cli, args.cli_runs)
                timed("       of which: python -c 'import llmgw.cli.main'", python_start, args.cli_runs)
        finally:
            server.close()
    finally:
        store.close()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
