"""Every Grafana panel's query answers from a real Prometheus scraping a real cluster.

A server (HTTPS on loopback, `--tls`), a joined agent, a llama.cpp model (the xllamacpp launcher on a tiny
GGUF) and a standalone router with two workers; Debian's Prometheus scrapes them every second with the two jobs
of ``deploy/prometheus/prometheus.yml``: the server's /metrics with its bearer token file (a router token) and CA
file (the cluster CA), the router's (plain HTTP on loopback, so without the CA). Traffic: streamed and whole chats
with a project's API key (which has a token budget) through both, and one request for a model that does not
exist.
Then each panel's query of each dashboard in ``deploy/grafana`` (``$model``, ``$project`` and Grafana's intervals
substituted) is run through Prometheus's HTTP API and must return data, and each variable's ``label_values`` must
list the cluster's model and project: a metric renamed in the code breaks this test, not a dashboard in production.

This machine has no GPU: the agent reads a captured ``nvidia-smi -q -x`` of two GPUs (the hardware it lacks; the
rest is real) so the GPU panels have series. The KV cache panel is the one that cannot have data here: llama.cpp's
server has no KV cache gauge (vLLM's ``vllm:kv_cache_usage_perc`` feeds it); its query must still be valid.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from llmgw.testing import dashboards, tiny_gguf
from llmgw.testing.burst import StandaloneRouter
from llmgw.testing.procs import wait_for
from llmgw.testing.prometheus import Prometheus
from llmgw.testing.system import System, running

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODEL = "tiny"
PROJECT = "team"
#: Panels whose series only some engines feed, with why they are empty here.
ENGINE_ONLY = {"Engine: KV cache in use": "llama.cpp's server exports no KV cache gauge (vLLM does)"}


def fake_nvidia_smi(path: Path) -> Path:
    """A script printing a captured ``nvidia-smi -q -x`` of two GPUs (this machine has none)."""
    xml = FIXTURES / "nvidia-smi-q-x-2gpu.xml"
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(xml)!r}).read())\n")
    path.chmod(0o755)
    return path


def traffic(url: str, s: System, key: str, n: int) -> None:
    """Streamed and whole chats with ``key`` to the router at ``url``, and a request for a model the cluster does
    not have (404)."""
    with httpx.Client(verify=s.ssl_context() or True, timeout=60, trust_env=False) as http:
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, http_client=http)
        for i in range(n):
            messages = [{"role": "user", "content": f"Count to {i + 3}."}]
            chunks = list(client.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                                         max_tokens=12, stream=True))
            assert any(c.choices and c.choices[0].delta.content for c in chunks)
            whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
            assert whole.usage is not None and whole.usage.completion_tokens > 0
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_every_dashboard_panel_returns_data_from_prometheus_scraping_a_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    models.mkdir()
    gguf = tiny_gguf.write_tiny_llama_gguf(models / "tiny.gguf")
    os.chmod(models, 0o755)  # the engine runs as a uid of its own and reads the model from here
    smi = fake_nvidia_smi(tmp_path / "nvidia-smi")
    agent_env = {"LLMGW_AGENT_MODEL_DIRS": str(models), "LLMGW_AGENT_DISCOVERY__PREFER_NVML": "false",
                 "LLMGW_AGENT_DISCOVERY__NVIDIA_SMI": str(smi)}
    # The router is stopped (the stack) before the cluster.
    with running(tmp_path / "cluster", server_args=["--tls"], https=True, agent_env=agent_env) as s, \
            contextlib.ExitStack() as stack:
        s.apply({"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": MODEL},
                 "spec": {"engine": "llamacpp", "source": f"file://{gguf}", "served_name": MODEL,
                          "engine_args": ["--ctx-size", "512", "--parallel", "2"], "startup_timeout": "90s"}})
        s.wait_model(MODEL, timeout=120)
        s.wait_router(MODEL, 1, timeout=60)  # with the admin's token: before any API key exists
        made = s.request("POST", "/api/v1/projects", json={"name": PROJECT})
        assert made.status_code in (200, 201), made.text
        made = s.request("POST", "/api/v1/keys", json={"name": "app", "project": PROJECT,
                                                       "limits": {"tokens_per_day": 100_000}})
        assert made.status_code in (200, 201), made.text
        key = made.json()["key"]
        # Prometheus's credential: a router token, as the scrape config's comment says to make.
        made = s.request("POST", "/api/v1/routers", json={"name": "prometheus"})
        assert made.status_code in (200, 201), made.text
        (tmp_path / "token").write_text(made.json()["token"] + "\n")
        wait_for(lambda: s.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200,
                 timeout=30, what="the router taking the new key")
        monkeypatch.setenv("LLMGW_ROUTER_CONTROL_CA_HASH", s.ca_hash)  # the router pins the cluster CA
        router = StandaloneRouter(s, tmp_path, "edge", workers=2)
        stack.callback(router.stop)
        router.start()

        jobs = {j["job_name"]: j for j in dashboards.scrape_config()["scrape_configs"]}
        job = jobs["llmgw-control-plane"]
        job["authorization"]["credentials_file"] = str(tmp_path / "token")
        job["tls_config"]["ca_file"] = str(s.ca_file)
        job["static_configs"] = [{"targets": [f"127.0.0.1:{s.http_port}"]}]
        routers = jobs["llmgw-routers"]
        routers["scheme"] = "http"  # a router on loopback serves plain HTTP; beyond it, HTTPS as the file says
        del routers["tls_config"]
        routers["static_configs"] = [{"targets": [f"127.0.0.1:{router.port}"]}]
        (tmp_path / "prom").mkdir()
        with Prometheus(tmp_path / "prom", [job, routers]) as prom:
            wait_for(lambda: router.proc is not None and httpx.get(
                router.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200,
                timeout=30, what="the standalone router serving the key")
            traffic(s.url, s, key, 4)
            traffic(router.url, s, key, 2)
            started = time.monotonic()
            wait_for(lambda: len(prom.query("up == 1")) == 2, timeout=30,
                     what=f"Prometheus scraping the server and the router: {prom.targets()} {prom.log_tail()}")
            # The router's load scrape (every 1.5 s) has read the engine's token counter; the budget was synced.
            wait_for(lambda: prom.query(f'llmgw_engine_generation_tokens_total{{model="{MODEL}"}} > 0'), timeout=30,
                     what="the engine's tokens re-exported by the router")
            wait_for(lambda: prom.query("llmgw_budget_used_ratio > 0"), timeout=30, what="the key's budget synced")

            values = {"model": MODEL, "project": PROJECT}
            queries = list(dashboards.panel_queries(values))
            assert len(queries) >= 30
            empty: list[str] = []
            for q in queries:
                def answered(q: dashboards.Query = q) -> bool:
                    return bool(prom.query(q.expr))
                if q.panel in ENGINE_ONLY:
                    assert prom.query(q.expr) == [], q  # valid PromQL (a bad one raises), no engine here feeds it
                    continue
                try:
                    wait_for(answered, timeout=max(1.0, 20 - (time.monotonic() - started)), interval=0.5,
                             what=q.expr)
                except TimeoutError:
                    empty.append(f"{q.dashboard}: {q.panel}: {q.expr}")
            assert not empty, "panels with no data:\n" + "\n".join(empty)

            for q in dashboards.variable_queries():
                metric, label = q.expr.removeprefix("label_values(").rstrip(")").replace(" ", "").split(",")
                listed = prom.api(f"label/{label}/values", **{"match[]": metric})
                assert values[label] in listed, (q, listed)

            gpus = prom.query("llmgw_gpu_memory_total_bytes")
            assert {g["metric"]["gpu"] for g in gpus} == {"0", "1"}, gpus
            certs = {(c["metric"]["certificate"], c["metric"].get("node", ""))
                     for c in prom.query("llmgw_certificate_expiry_timestamp_seconds > time()")}
            assert {("ca", ""), ("api", ""), ("server", ""), ("node", "node1")} <= certs, certs
            replicas = [r["id"] for r in s.replicas(MODEL)]
            for job_name in ("llmgw-control-plane", "llmgw-routers"):  # each router re-exports the engine's figures
                running_now = prom.query(f'llmgw_engine_requests_running{{model="{MODEL}", job="{job_name}"}}')
                assert [r["metric"]["replica"] for r in running_now] == replicas, (job_name, running_now)
            served = prom.query(f'sum by (job) (llmgw_router_requests_total{{model="{MODEL}", code="200"}})')
            assert {r["metric"]["job"] for r in served} == {"llmgw-control-plane", "llmgw-routers"}, served
