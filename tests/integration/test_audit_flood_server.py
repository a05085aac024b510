"""On a real server: a flood of rate-limited logins adds a handful of audit rows, and the retention prunes.

Found by an attacker's probe: 1,000 rate-limited anonymous logins added 1,000 rows in 2.9 s to a table that
was never pruned.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

COUNTED = re.compile(r"\A(\d+) refused logins? from 127\.0\.0\.1 in the 60 s from ")


def test_a_thousand_rate_limited_logins_add_a_handful_of_rows_that_count_them(tmp_path: Path) -> None:
    """1,000 wrong logins from one address: the few before the limit are rows of their own, the rate-limited
    rest are counted in one row a minute, and the counts add up to the 429s the server answered."""
    s = System(tmp_path)
    try:
        s.start_server()
        answered: dict[int, int] = {}
        with httpx.Client(base_url=s.url, timeout=30) as c:
            for _ in range(1000):
                code = c.post("/api/v1/login", json={"username": "mallory", "password": "guess"}).status_code
                answered[code] = answered.get(code, 0) + 1
        assert set(answered) == {401, 429} and answered[429] > 900, answered

        def logins() -> list[dict[str, object]]:
            return [e for e in s.get("/api/v1/audit?limit=10000")["items"] if e["action"] == "login"]

        def counted() -> int:
            return sum(int(m.group(1)) for e in logins() if (m := COUNTED.match(str(e["detail"]))))

        wait_for(lambda: counted() == answered[429], timeout=20, what="the counting rows caught up")
        refused = [e for e in logins() if e["outcome"] == "refused"]
        # The 401s (one row each, as before) plus one counting row a minute (two if the flood crossed one).
        assert len(refused) <= answered[401] + 2, [e["detail"] for e in refused]
    finally:
        s.close()


def test_entries_past_the_audit_retention_are_pruned_by_the_server(tmp_path: Path) -> None:
    """`llmgw server --audit-retention 3s`: an entry older than that goes, one written since stays."""
    s = System(tmp_path, server_args=("--audit-retention", "3s"))
    try:
        s.start_server()
        assert s.request("POST", "/api/v1/models/none/scale", json={"replicas": 1}).status_code == 404
        objects = lambda: [e["object"] for e in s.get("/api/v1/audit")["items"]]  # noqa: E731
        assert "model/none" in objects()
        wait_for(lambda: "model/none" not in objects(), timeout=30, interval=0.5, what="the old entry pruned")
        assert s.request("POST", "/api/v1/nodes/n9/cordon").status_code == 404
        assert "node/n9" in objects()  # newer than the retention: kept
    finally:
        s.close()
