"""0.2.0 beside priority classes (issue 32): what this tree stores and publishes, read by the previous release.

A database where this tree set ``priority_classes``, a project's and a key's class and weight is opened by the
previous release's own code (its venv, ``tests/upgrade/PREVIOUS``): it lists the keys, the projects and its cluster
settings and builds its routers' table without an error; and its router reads this tree's table (with the new
fields) and still identifies the keys. (The fields are not in the keys' ``limits`` JSON, which 0.2.0 reads strictly:
the last assertion shows it would refuse them there.)
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from llmgw.control.loop.table import build_endpoints_doc
from llmgw.control.store import queueing
from llmgw.control.store import settings as cluster_settings
from llmgw.control.store.store import Store, StoredKey
from llmgw.testing import releases

REPO = Path(__file__).resolve().parents[2]
SECRET = "llmgw-prio-secret-0123456789"

PREVIOUS_READS = r"""
import json, pathlib, sys
from llmgw.control.store.store import Store
from llmgw.control.store import settings
from llmgw.control.loop.table import build_endpoints_doc
from llmgw.router.auth import Authenticator
from llmgw.core import quota
store = Store.open(pathlib.Path(sys.argv[1]))
keys = [(k.id, k.project, k.priority) for k in store.list_keys()]
projects = sorted(p.name for p in store.list_projects())
own = build_endpoints_doc(store, 0.0).to_doc()["auth"]
auth = Authenticator.from_doc(json.loads(sys.argv[2]))
found = auth.identify(("Bearer " + sys.argv[3]).encode())
try:
    quota.Limits.from_doc({"priority_class": "batch"})
    strict = False
except quota.BadLimits:
    strict = True
print(json.dumps({"keys": keys, "projects": projects, "settings": settings.read(store).model_dump(),
                  "own_table_keys": [k["id"] for k in own["keys"]], "identified": [found.id, found.project],
                  "limits_strict": strict}))
"""


@pytest.fixture(scope="module")
def previous() -> releases.Release:
    return releases.build(REPO, releases.previous_commit(REPO), releases.default_cache_root(REPO))


def test_the_previous_release_reads_what_priorities_stored_and_published(tmp_path: Path,
                                                                          previous: releases.Release) -> None:
    data = tmp_path / "data"
    store = Store.open(data)
    store.create_project("team-a", description="", created_by="test", now=1.0)
    store.add_key(StoredKey(id="key-prio", name="k", sha256=hashlib.sha256(SECRET.encode()).hexdigest(),
                            project="team-a", priority=3, created_at=1.0))
    assert cluster_settings.write(store, {"priority_classes": ["premium", "interactive", "batch"]}, by="test") \
        == ["priority_classes"]
    queueing.assign(store, "projects", "team-a", queueing.Assigned("premium", 4.0), by="test")
    queueing.assign(store, "keys", "key-prio", queueing.Assigned("batch", 0.5), by="test")
    table = build_endpoints_doc(store, 0.0).to_doc()
    store.close()
    assert table["auth"]["priority_classes"] == ["premium", "interactive", "batch"]
    assert table["auth"]["keys"][0]["priority_class"] == "batch"

    ran = subprocess.run(previous.python_argv("-c", PREVIOUS_READS, str(data), json.dumps(table["auth"]), SECRET),
                         env=previous.env(), cwd=previous.venv, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout.strip().splitlines()[-1])
    assert seen["keys"] == [["key-prio", "team-a", 3]]
    assert seen["projects"] == ["default", "team-a"]
    assert "priority_classes" not in seen["settings"] and seen["settings"]["allow_remote_code"] is False
    assert seen["own_table_keys"] == ["key-prio"]
    assert seen["identified"] == ["key-prio", "team-a"]
    assert seen["limits_strict"] is True  # why the class and weight are not kept in the keys' limits JSON
