"""``GET /api/v1/usage`` and ``llmgw usage`` against a real control plane: the REST app with real authentication
over a real SQLite store, served by uvicorn on 127.0.0.1, rollup rows put straight into the store.

Who sees what: an operator every project; a user only the projects they have a role in, and a project they
are not in is a 404 that reads the same whether it exists or not. The CLI runs as a process, as a person
runs it, in its three output shapes.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from llmgw.control.auth import Auth, passwords, principals
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredUser
from llmgw.control.store.tables import ProjectMemberRow
from llmgw.control.store.usagetables import UsageRollupRow
from llmgw.core import quota
from llmgw.testing.procs import free_port, wait_for

HOUR = 3600


class ControlPlane:
    """The REST app with real authentication on a free port, in a thread of the test."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = Store.open(data_dir)
        self.db = StoreThread(self.store)
        self.auth = Auth(self.db)
        app = create_api(self.db, Cluster(self.store), auth=self.auth)
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    def user(self, name: str, role: str, projects: tuple[str, ...] = ()) -> str:
        """Makes user ``name`` with ``role``, a member of ``projects``; returns a REST token for them."""
        self.store.put_user(StoredUser(name, role, passwords.hash_password("pw"), 0.0))
        with self.store._session.begin() as s:
            s.add_all([ProjectMemberRow(project=p, user=name, role="member") for p in projects])
        token, _ = asyncio.run(self.auth.issue(kind="user", subject=name, ttl_s=600))
        return token

    def __enter__(self) -> ControlPlane:
        self.thread.start()
        wait_for(self._answers, timeout=20, what="control plane listening")
        return self

    def _answers(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.db.close()
        self.store.close()


def put(store: Store, project: str, key: str, model: str, **sums: Any) -> None:
    start = int(time.time()) // HOUR * HOUR - HOUR  # in the hour before this one
    hist = [0] * (len(quota.TTFT_BUCKETS_MS) + 1)
    hist[quota.ttft_bucket(120)] = sums.get("requests", 1)
    row = {"requests": 1, "errors": 0, "prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0,
           "spend_micros": 0, "ttft_ms_sum": 120.0, "ttft_count": sums.get("requests", 1), "duration_ms_sum": 0.0,
           "ttft_hist": hist, **sums}
    with store._session.begin() as s:  # its minute, hour and day rows, as the ingest writes them
        s.add_all([UsageRollupRow(grain=grain, start=start // step * step, project=project, key=key, model=model,
                                  user="", node="n1", **row) for grain, step in (("m", 60), ("h", HOUR), ("d", 86400))])


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("usage") / "data") as c:
        put(c.store, "alpha", "ka1", "llama", requests=3, prompt_tokens=300, cached_tokens=100, completion_tokens=30,
            spend_micros=2_500_000, duration_ms_sum=900.0)
        put(c.store, "alpha", "ka2", "qwen", requests=1, prompt_tokens=10, completion_tokens=5, duration_ms_sum=100.0)
        put(c.store, "beta", "kb1", "llama", requests=7, prompt_tokens=700, completion_tokens=70, errors=2)
        yield c


@pytest.fixture(scope="module")
def tokens(cp: ControlPlane) -> dict[str, str]:
    return {"ann": cp.user("ann", principals.VIEWER, ("alpha",)), "ops": cp.user("ops", principals.OPERATOR),
            "eve": cp.user("eve", principals.VIEWER)}


def get(cp: ControlPlane, token: str, path: str) -> httpx.Response:
    return httpx.get(cp.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def groups(resp: httpx.Response) -> dict[str, int]:
    assert resp.status_code == 200, resp.text
    return {r["group"]: r["requests"] for r in resp.json()["rows"]}


def test_an_operator_sees_every_project_and_a_member_only_their_own(cp: ControlPlane, tokens: dict[str, str]) -> None:
    assert groups(get(cp, tokens["ops"], "/api/v1/usage")) == {"beta": 7, "alpha": 4}
    assert groups(get(cp, tokens["ann"], "/api/v1/usage")) == {"alpha": 4}
    assert groups(get(cp, tokens["ann"], "/api/v1/usage?by=model")) == {"llama": 3, "qwen": 1}
    assert groups(get(cp, tokens["ops"], "/api/v1/usage?by=model")) == {"llama": 10, "qwen": 1}
    assert groups(get(cp, tokens["eve"], "/api/v1/usage")) == {}  # a member of nothing sees nothing
    doc = get(cp, tokens["ann"], "/api/v1/usage?since=24h&project=alpha&by=key").json()
    assert doc["grain"] == "h" and doc["by"] == "key"
    ka1 = next(r for r in doc["rows"] if r["group"] == "ka1")
    assert (ka1["prompt_tokens"], ka1["cached_tokens"], ka1["completion_tokens"], ka1["total_tokens"]) == \
        (300, 100, 30, 330)
    assert ka1["spend"] == 2.5 and ka1["duration_ms_mean"] == 300.0 and ka1["ttft_p90_ms"] == 250.0


def test_a_member_asking_for_another_project_gets_a_404_that_reveals_nothing(cp: ControlPlane,
                                                                               tokens: dict[str, str]) -> None:
    """beta exists and has usage, gamma does not: the member of alpha reads the same sentence for both."""
    answers = {p: get(cp, tokens["ann"], f"/api/v1/usage?project={p}") for p in ("beta", "gamma")}
    for project, resp in answers.items():
        assert resp.status_code == 404, resp.text
        err = resp.json()["error"]
        assert err["code"] == "project_not_found" and f"project {project!r}" in err["message"]
        assert "llama" not in resp.text and "kb1" not in resp.text
    assert answers["beta"].json()["error"]["message"].replace("beta", "gamma") == \
        answers["gamma"].json()["error"]["message"]
    assert get(cp, tokens["ann"], "/api/v1/usage/series?project=beta").status_code == 404
    assert groups(get(cp, tokens["ops"], "/api/v1/usage?project=beta")) == {"beta": 7}


def test_bad_since_until_by_and_bucket_are_422_naming_the_parameter(cp: ControlPlane, tokens: dict[str, str]) -> None:
    for query, param in (("since=yesterday", "since"), ("since=7x", "since"), ("until=soon", "until"),
                         ("since=1h&until=2h", "until"), ("by=colour", "by")):
        resp = get(cp, tokens["ops"], f"/api/v1/usage?{query}")
        assert resp.status_code == 422, (query, resp.text)
        err = resp.json()["error"]
        assert err["param"] == param and param in err["message"], (query, err)
    resp = get(cp, tokens["ops"], "/api/v1/usage/series?bucket=week")
    assert resp.status_code == 422 and resp.json()["error"]["param"] == "bucket"
    assert get(cp, tokens["ops"], "/api/v1/usage?since=2026-01-01").status_code == 200


def test_the_series_is_per_day_and_per_project(cp: ControlPlane, tokens: dict[str, str]) -> None:
    rows = get(cp, tokens["ops"], "/api/v1/usage/series?since=7d&bucket=day&by=project").json()["rows"]
    today = time.strftime("%Y-%m-%d", time.gmtime(int(time.time()) // HOUR * HOUR - HOUR))
    assert {(r["group"], r["series"], r["requests"]) for r in rows} == {(today, "alpha", 4), (today, "beta", 7)}


@pytest.fixture(scope="module")
def cli(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Runs ``llmgw usage ARGS`` as a process with a token, against ``cp``, in a home of its own (no saved contexts)."""
    home = tmp_path_factory.mktemp("home")

    def run(token: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "LLMGW_URL": cp.url, "LLMGW_TOKEN": token, "HOME": str(home)}
        return subprocess.run([sys.executable, "-m", "llmgw", "usage", *args], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
    return run


def test_the_cli_prints_a_table_json_and_csv(cli: Any, tokens: dict[str, str]) -> None:
    table = cli(tokens["ops"], "--by", "project", "--since", "7d")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert any("alpha" in line and "310" in line for line in lines), table.stdout  # 300 + 10 prompt tokens
    assert any("TOTAL" in line and "1,010" in line for line in lines), table.stdout  # 310 + 700 prompt tokens
    assert "MEAN DURATION" in table.stdout and "read at hour grain" in table.stderr

    as_json = cli(tokens["ann"], "--by", "model", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["by"] == "model" and {r["group"]: r["requests"] for r in doc["rows"]} == {"llama": 3, "qwen": 1}

    as_csv = cli(tokens["ops"], "--by", "key", "--model", "llama", "-o", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(r["key"], int(r["requests"]), int(r["prompt_tokens"]), float(r["spend"])) for r in rows] == \
        [("kb1", 7, 700, 0.0), ("ka1", 3, 300, 2.5)]
    assert as_csv.stdout.splitlines()[0].split(",")[:3] == ["key", "requests", "errors"]

    refused = cli(tokens["ann"], "--project", "beta")
    assert refused.returncode == 1 and "project 'beta'" in refused.stderr and not refused.stdout
