"""``kind: Adapter`` on a real server through the CLI and REST: applied beside its base model (which keeps it
when its own file is applied again), listed by ``llmgw get adapters``, refused with a sentence naming the field
(no base, a taken name, one the base's file lists), and deleted before its base may be."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from llmgw.core import adapterkind
from llmgw.testing.system import LLMGW, System, sim_model


def _cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**system.cli_env(), "LLMGW_URL": system.url, "COLUMNS": "250"}
    return subprocess.run([*LLMGW, *args], env=env, capture_output=True, text=True, timeout=60)


def adapter(name: str, base: str = "base", source: str = "hf://org/sql-lora") -> dict:
    return {"apiVersion": "llmgw/v1", "kind": "Adapter", "metadata": {"name": name},
            "spec": {"base": base, "source": source, "rank": 8}}


def test_an_adapter_is_applied_listed_kept_and_deleted_on_its_own(system: System, tmp_path: Path) -> None:
    base = sim_model("base", replicas=0, adapters=[{"name": "own", "source": "hf://org/own-lora"}])
    files = tmp_path / "both.yaml"
    files.write_text(yaml.safe_dump_all([base, adapter("base-sql")]))
    applied = _cli(system, "apply", "-f", str(files))
    assert applied.returncode == 0, applied.stderr
    assert "model/base created" in applied.stdout and "adapter/base-sql created" in applied.stdout

    listed = _cli(system, "get", "adapters", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = {a["name"]: (a["base"], a["applied"], a["source"]) for a in json.loads(listed.stdout)}
    assert rows == {"own": ("base", "Model", "hf://org/own-lora"), "base-sql": ("base", "Adapter", "hf://org/sql-lora")}
    stored = system.get("/api/v1/models/base")
    assert [a["name"] for a in stored["spec"]["adapters"]] == ["own", "base-sql"]
    assert stored["metadata"]["labels"] == {adapterkind.ATTACHED_LABEL: "base-sql"}

    # The base's own file applied again (another replica count) keeps the adapter applied beside it.
    again = tmp_path / "base.yaml"
    again.write_text(yaml.safe_dump({**base, "spec": {**base["spec"], "replicas": 0, "aliases": ["b"]}}))
    assert _cli(system, "apply", "-f", str(again)).returncode == 0
    assert [a["name"] for a in system.get("/api/v1/models/base")["spec"]["adapters"]] == ["own", "base-sql"]

    refusals = {
        "nobase": (adapter("x-sql", base="nope"), "spec.base", "model 'nope' does not exist"),
        "taken": (adapter("b"), "metadata.name", "already a name of this model"),
        "listed": (adapter("own"), "metadata.name", "listed in model base's spec.adapters"),
    }
    for doc, param, words in refusals.values():
        got = system.request("POST", "/api/v1/adapters", json=doc)
        assert got.status_code == 422, got.text
        assert got.json()["error"]["param"] == param and words in got.json()["error"]["message"], got.text

    refused = _cli(system, "delete", "model", "base")
    assert refused.returncode == 1 and "delete them first" in refused.stderr and "base-sql" in refused.stderr
    own = system.request("DELETE", "/api/v1/adapters/own")
    assert own.status_code == 422 and "remove it there" in own.json()["error"]["message"]
    deleted = _cli(system, "delete", "adapter", "base-sql")
    assert deleted.returncode == 0, deleted.stderr
    assert [a["name"] for a in system.get("/api/v1/models/base")["spec"]["adapters"]] == ["own"]
    assert system.request("DELETE", "/api/v1/adapters/base-sql").status_code == 404
    assert _cli(system, "delete", "model", "base").returncode == 0
    actions = [(r["action"], r["object"]) for r in system.get("/api/v1/audit")["items"]]
    assert ("apply", "adapter/base-sql") in actions and ("delete", "adapter/base-sql") in actions
