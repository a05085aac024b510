"""How each router that bench/router_peers.py compares is started, in front of one upstream.

A ``Contender`` is the argv, environment and config files one router needs to
forward ``/v1/chat/completions`` for one model to one OpenAI-compatible URL,
plus the URL that says it is ready and the key a client sends it. Each peer is
set up the way its own docs describe for "one OpenAI-compatible backend",
with nothing tuned, and with the same load-balancing policy where it has one
(``--policy``; with one worker the choice only changes the per-request
bookkeeping: cache_aware inserts every prompt into a prefix tree).

``find`` answers the contender or the reason it cannot run (binary missing),
so a machine without the peers' venv still runs the llmgw and direct rows.

The peers come from ``make bench-peers`` (bench/.venv-peers); llmgw and the sim
run from the project's own .venv, so each router runs with exactly its own
dependencies (uvloop and httptools for llmgw, when installed).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from llmgw.testing.procs import free_port

REPO = Path(__file__).resolve().parent.parent
PEERS_BIN = REPO / "bench" / ".venv-peers" / "bin"
PROJECT_PY = REPO / ".venv" / "bin" / "python"

NAMES = ("llmgw", "litellm", "sglang-router", "vllm-router")

#: LiteLLM fetches its model cost map, beta headers, policy templates, blog posts and
#: autorouter presets from GitHub at start; without these it stalls on a machine
#: with no way out before it serves anything.
LITELLM_OFFLINE = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_TELEMETRY": "False",
    "DISABLE_SCHEMA_UPDATE": "True",
}
LITELLM_KEY = "sk-bench-master"

#: The peers' ``--policy`` values and llmgw's ``routing`` that does the same with one worker.
LLMGW_ROUTING = {"round_robin": "round_robin", "cache_aware": "prefix_cache"}


@dataclasses.dataclass(frozen=True)
class Contender:
    """One router in front of the upstream: how to start it and how to call it."""

    name: str
    argv: list[str]
    url: str
    ready_path: str
    key: str = ""
    env: dict[str, str] | None = None
    note: str = ""  # how it was configured, for the report


def python_for_project() -> str:
    """The project's venv Python, where the llmgw router has its own dependencies; else this one."""
    return str(PROJECT_PY) if PROJECT_PY.exists() else sys.executable


def find(name: str, *, upstream: str | list[str], model: str, workdir: Path, policy: str) -> Contender | str:
    """The contender called ``name`` forwarding to ``upstream`` (one URL or several), or why it cannot run here.

    LiteLLM takes one ``api_base`` per model entry: with several upstreams it gets the first.
    """
    upstreams = [upstream] if isinstance(upstream, str) else list(upstream)
    upstream = upstreams[0]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if name == "llmgw":
        # The peers' policy under llmgw's name for it; an llmgw routing name passes as it is.
        routing = LLMGW_ROUTING.get(policy, policy)
        table = {"version": 1, "models": [{"name": model, "served_name": model, "state": "Ready", "routing": routing,
                                           "endpoints": [{"replica_id": f"r-bench-{i}", "url": u}
                                                         for i, u in enumerate(upstreams)]}]}
        path = workdir / "llmgw-table.json"
        path.write_text(json.dumps(table))
        return Contender(name, [python_for_project(), "-m", "llmgw.router.standalone", "--port", str(port),
                                "--table-file", str(path), "--log-level", "warning"],
                         url, "/v1/models", note=f"standalone, static table, one endpoint, routing {routing}",
                         # One process (one core), by variable: a checkout from before --workers ignores it.
                         env={**os.environ, "LLMGW_ROUTER_WORKERS": "1"})
    binary = PEERS_BIN / {"litellm": "litellm", "sglang-router": "sglang-router",
                          "vllm-router": "vllm-router"}[name]
    if not binary.exists():
        return f"{binary} is missing; run `make bench-peers`"
    if name == "litellm":
        # JSON is YAML, so the config needs no YAML writer here.
        config = {"model_list": [{"model_name": model,
                                  "litellm_params": {"model": f"openai/{model}", "api_base": upstream + "/v1",
                                                     "api_key": "none"}}],
                  "general_settings": {"master_key": LITELLM_KEY},
                  "litellm_settings": {"telemetry": False}}
        path = workdir / "litellm.yaml"
        path.write_text(json.dumps(config))
        return Contender(name, [str(binary), "--config", str(path), "--host", "127.0.0.1", "--port", str(port),
                                "--num_workers", "1"],
                         url, "/health/liveliness", key=LITELLM_KEY, env={**os.environ, **LITELLM_OFFLINE},
                         note="proxy, config model openai/<model> with api_base, master key, 1 worker, no DB")
    metrics = str(free_port())
    if name == "sglang-router":
        return Contender(name, [str(binary), "launch", "--host", "127.0.0.1", "--port", str(port),
                                "--worker-urls", *upstreams, "--policy", policy,
                                "--prometheus-host", "127.0.0.1", "--prometheus-port", metrics,
                                "--log-level", "warn"],
                         url, "/health", note=f"launch --worker-urls <sim> --policy {policy}")
    return Contender(name, [str(binary), "--host", "127.0.0.1", "--port", str(port),
                            "--worker-urls", *upstreams, "--policy", policy,
                            "--prometheus-host", "127.0.0.1", "--prometheus-port", metrics,
                            "--log-level", "warning"],
                     url, "/health", note=f"--worker-urls <sim> --policy {policy}")
