"""How the hub starts its workers (``router.workers``): the restart backoff, each worker's settings and environment."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.router import standalone, workers
from llmgw.router.settings import HUB_PID_ENV, HUB_STATIC_ENV, TOKEN_ENV, ProxySettings, RouterSettings


def test_a_worker_that_keeps_dying_waits_longer_each_time_and_one_that_ran_a_while_starts_at_once() -> None:
    backoff = workers.Backoff()
    assert [backoff.after_exit(1.0) for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.after_exit(30.0) == 0.5  # it ran 30 s: a crash, not a crash loop
    assert backoff.after_exit(0.1) == 1.0
    assert backoff.after_exit(29.9) == 2.0


def test_a_status_reads_as_an_exit_or_a_signal() -> None:
    assert workers.describe(2) == "exit 2"
    assert workers.describe(-9) == "SIGKILL"
    assert workers.describe(-200) == "signal 200"


def test_each_worker_is_the_hubs_router_following_the_hub_under_a_name_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hubs = RouterSettings(control=("http://cp1:8080", "http://cp2:8080"), token_file=tmp_path / "token",
                          host="0.0.0.0", port=0, router_id="edge", usage_journal_dir=tmp_path / "journal",
                          workers=4, graceful_shutdown=12.0, proxy=ProxySettings(keepalive=3.0, admission_queue=9))
    values = workers.worker_settings(hubs, 2, hub_url="http://127.0.0.1:4567", port=8123)
    path = workers.write_config(tmp_path, 2, values)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "token" not in path.read_text().replace("token_file", "")  # no secret, and no token file either
    for name in list(os.environ):
        if name.startswith("LLMGW_ROUTER_"):
            monkeypatch.delenv(name)
    got = standalone.parse_args(["--config", str(path)])
    assert got == RouterSettings(control=("http://127.0.0.1:4567",), host="0.0.0.0", port=8123, router_id="edge.w2",
                                 usage_journal_dir=tmp_path / "journal" / "w2", workers=1, graceful_shutdown=12.0,
                                 proxy=ProxySettings(keepalive=3.0, admission_queue=9))


def test_a_static_tables_worker_follows_the_hub_too(tmp_path: Path) -> None:
    values = workers.worker_settings(RouterSettings(table_file=tmp_path / "t.json", router_id=""), 0,
                                     hub_url="http://127.0.0.1:1", port=80)
    assert "table_file" not in values and values["control"] == "http://127.0.0.1:1"
    assert values["router_id"].endswith(".w0") and "usage_journal_dir" not in values


def test_a_workers_environment_has_the_hubs_secret_and_pid_and_none_of_the_routers_variables() -> None:
    env = workers.worker_env({"PATH": "/bin", "LLMGW_ROUTER_CONTROL": "http://elsewhere:1", "LLMGW_ROUTER_TOKEN": "t",
                              "LLMGW_ROUTER_WORKERS": "4", "LLMGW_TRACING_ENDPOINT": "http://otel:4318"},
                             secret="s", hub_pid=77)
    assert env == {"PATH": "/bin", "LLMGW_TRACING_ENDPOINT": "http://otel:4318", TOKEN_ENV: "s", HUB_PID_ENV: "77"}



def test_workers_of_a_static_table_meter_and_report_nothing_but_keep_their_budgets() -> None:
    """Over a static table nobody stores usage or reads load reports: the hub says so (``HUB_STATIC_ENV``) and its
    workers keep only the budgets' leases (issue 27: metering was a quarter of each worker's core)."""
    env = workers.worker_env({"PATH": "/bin", HUB_STATIC_ENV: "1"}, secret="s", hub_pid=7, static=False)
    assert HUB_STATIC_ENV not in env  # only the hub decides
    assert workers.worker_env({}, secret="s", hub_pid=7, static=True)[HUB_STATIC_ENV] == "1"
    settings = RouterSettings(control=("http://127.0.0.1:9",), router_id="edge.w0")
    static = standalone.build(settings, token="s", static_hub=True)
    assert static.quota is not None and static.journal is None and static.meter is not None
    assert not static.meter.keeps and static._signals is None and static._events is None
    following = standalone.build(settings, token="s")
    assert following.journal is not None and following.meter is not None and following.meter.keeps
    assert following._signals is not None and following._events is not None


def _python(code: str) -> Callable[[Path], list[str]]:
    return lambda config: [sys.executable, "-c", code]


def test_the_supervisor_restarts_a_worker_that_exits_and_kills_one_that_ignores_sigterm(tmp_path: Path) -> None:
    """Real child processes: one exits 3 at once (started again, with the backoff between), one ignores SIGTERM
    (killed once the grace period is over)."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); " \
               "time.sleep(60)"

    async def scenario() -> tuple[float, list[int], float]:
        crashing = workers.Supervisor([tmp_path / "a"], {}, grace_s=0.5, extra_grace_s=0.0,
                                      argv=_python("import sys; sys.exit(3)"))
        t0 = time.monotonic()
        crashing.start()
        while crashing.starts[0] < 3:
            assert time.monotonic() - t0 < 20, crashing.starts
            await asyncio.sleep(0.01)
        third = time.monotonic() - t0  # after two exits and 0.5 + 1 s of backoff between the starts
        await crashing.stop()
        holding = workers.Supervisor([tmp_path / "b"], {}, grace_s=0.5, extra_grace_s=0.0, argv=_python(stubborn))
        holding.start()
        await asyncio.sleep(0.5)
        pids = holding.pids
        t0 = time.monotonic()  # the stop's own time
        await holding.stop()
        return third, pids, time.monotonic() - t0

    third, pids, took = asyncio.run(scenario())
    assert third >= 1.5
    assert len(pids) == 1 and not os.path.exists(f"/proc/{pids[0]}")
    assert 0.5 <= took < 3.0
