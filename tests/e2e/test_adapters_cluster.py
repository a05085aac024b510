"""Adapters in a running cluster (server, agent, sim engine, router): a model applied with two adapters serves
each under its own name, repeatably and differently from the base; adding a third to the spec loads it into
the same engine process (same pid), removing one unloads it, and requests to the names that stay never fail."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.testing.load import Load
from llmgw.testing.procs import wait_for
from llmgw.testing.system import LLMGW, System, sim_model


@pytest.fixture
def system_args(tmp_path: Path) -> dict[str, Any]:
    """Adapters are local directories under the test's folder: the agent's source roots must hold them."""
    return {"agent_env": {"LLMGW_AGENT_SOURCE_ROOTS": str(tmp_path)}}


def model(tmp_path: Path, *names: str) -> dict[str, Any]:
    for name in names:
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "adapter_config.json").write_text("{}")
    return sim_model("base", args=["--decode-tps", "2000"],
                     adapters=[{"name": n, "source": str(tmp_path / n)} for n in names])


def answer(system: System, name: str) -> tuple[int, str]:
    r = system.request("POST", "/v1/chat/completions", json={"model": name, "max_tokens": 2,
                                                              "messages": [{"role": "user", "content": "hi"}]})
    return r.status_code, r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r.text


def served(system: System, name: str, text: str) -> None:
    wait_for(lambda: answer(system, name) == (200, text), timeout=20, interval=0.1, what=f"{name} answers {text!r}")


def holders(system: System) -> list[tuple[str, ...]]:
    return [tuple(s.get("adapters", ())) for n in system.get("/api/v1/nodes")["items"] for s in n["shard_states"]
            if s["state"] == "Ready"]


def test_adapters_load_change_and_unload_without_a_restart(system: System, tmp_path: Path) -> None:
    system.apply(model(tmp_path, "sql", "chat"))
    system.wait_model("base")
    served(system, "sql", " sql:tok0 sql:tok1")
    served(system, "chat", " chat:tok0 chat:tok1")
    assert answer(system, "base") == (200, " tok0 tok1")
    (pid,) = system.engine_pids()
    listed = httpx.get(f"{system.url}/v1/models", timeout=10).json()["data"]
    assert {(m["id"], m.get("parent")) for m in listed} >= {("base", None), ("sql", "base"), ("chat", "base")}
    with Load(system.url, "chat", clients=2) as chat, Load(system.url, "base", clients=2) as base:
        wait_for(lambda: chat.ok >= 10 and base.ok >= 10, timeout=20, what="load running")
        system.apply(model(tmp_path, "sql", "chat", "code"))
        served(system, "code", " code:tok0 code:tok1")
        assert system.engine_pids() == {pid}
        system.apply(model(tmp_path, "chat", "code"))
        wait_for(lambda: answer(system, "sql")[0] == 404, timeout=20, interval=0.1, what="sql gone")
        wait_for(lambda: holders(system) == [("chat", "code")], timeout=20, interval=0.1, what="sql unloaded")
        before = (chat.ok, base.ok)
        wait_for(lambda: chat.ok >= before[0] + 10 and base.ok >= before[1] + 10, timeout=20, what="load after")
    assert chat.failures == [] and base.failures == [], (chat.failures[:3], base.failures[:3])
    assert system.engine_pids() == {pid}
    assert system.model_status("base")["state"] == "Ready"
    # `llmgw describe model` and the replicas list say which replica holds which adapter.
    described = system.get("/api/v1/models/base/describe")["replicas"]
    assert [r["adapters"] for r in described] == [["chat", "code"]]
    assert [r["adapters"] for r in system.replicas("base")] == [["chat", "code"]]
    out = subprocess.run([*LLMGW, "describe", "model", "base", "--url", system.url], env=system.cli_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "holds adapters: chat, code" in out, out
    # An adapter's name is a model name: another model may not take it, nor give an adapter a model's name.
    taken = system.request("POST", "/api/v1/models", json=sim_model("chat"))
    assert taken.status_code == 422 and "adapter of model base" in taken.text
