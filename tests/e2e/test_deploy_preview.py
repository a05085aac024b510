"""``POST /api/v1/preview`` against a real server, two real agents and a local hub (a real ``llmgw mirror``):
the metadata read through the hub, the memory per engine, and the placer's dry run with each node's reason.
Nothing a preview does is stored."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from llmgw.testing import deployhub, system, tiny_gguf

pytestmark = pytest.mark.slow

GGUF = f"{deployhub.GGUF_REPO}/{deployhub.GGUF_FILE}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[system.System]:
    work = tmp_path_factory.mktemp("deploy-preview")
    with deployhub.running(work) as hub:
        s = system.System(work, server_args=["--hub-endpoint", hub, "--mirror-url", hub])
        try:
            s.start_server()
            s.start_agent("node1")
            s.start_agent("node2")
            yield s
        finally:
            s.close()


def _preview(s: system.System, **body: Any) -> dict[str, Any]:
    resp = s.request("POST", "/api/v1/preview", json=body)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_a_gguf_from_the_hub_that_fits_names_its_node(cluster: system.System) -> None:
    got = _preview(cluster, source=GGUF, context=2048, concurrency=2)
    meta = got["metadata"]
    assert (meta["source"], meta["format"], meta["architecture"], meta["dtype"]) == (
        f"hf://{GGUF}", "gguf", "llama", "F32")
    assert (meta["layers"], meta["heads"], meta["kv_heads"], meta["context_length"]) == (
        tiny_gguf.N_LAYER, tiny_gguf.N_HEAD, tiny_gguf.N_HEAD_KV, tiny_gguf.N_CTX)
    assert meta["files"] == {deployhub.GGUF_FILE: meta["size_bytes"]} and meta["params"] > 0
    assert got["engines"] == ["llamacpp", "sim"] and got["engine"] == "llamacpp"
    llama = next(m for m in got["memory"] if m["engine"] == "llamacpp")
    # 2 layers x 2 KV heads x 16 x 2 (K and V) x 2 bytes = 256 bytes a token, for 2 x 2048 tokens.
    assert llama["kv_bytes"] == 256 * 2048 * 2 and llama["weights_bytes"] == meta["size_bytes"]
    assert got["manifest"]["spec"]["engine_args"] == ["--ctx-size", "4096", "--parallel", "2"]
    placement = got["placement"]
    assert (placement["placed"], placement["wanted"], placement["message"]) == (1, 1, "")
    landed = [n for n in placement["nodes"] if n["replicas"]]
    assert len(landed) == 1 and landed[0]["node"] in ("node1", "node2")
    other = next(n for n in placement["nodes"] if not n["replicas"])
    assert other["fits"] and other["reason"] == ""
    assert cluster.get("/api/v1/models")["items"] == []  # a dry run: nothing applied


def test_a_model_too_big_for_every_node_gives_each_nodes_reason(cluster: system.System) -> None:
    got = _preview(cluster, source=GGUF, context=1_000_000, concurrency=1024)
    placement = got["placement"]
    assert placement["placed"] == 0 and "no node can run a replica of" in placement["message"]
    assert [n["node"] for n in placement["nodes"]] == ["node1", "node2"]
    for n in placement["nodes"]:
        assert "free memory, needs" in n["reason"] and not n["fits"], n


def test_safetensors_through_the_hub_and_the_engine_no_node_has(cluster: system.System) -> None:
    got = _preview(cluster, source=f"hf://{deployhub.ST_REPO}", context=4096)
    meta = got["metadata"]
    assert (meta["format"], meta["architecture"], meta["dtype"], meta["params"]) == (
        "safetensors", "LlamaForCausalLM", "bfloat16", 512 * 576 + 576)
    assert set(meta["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert got["engines"] == ["vllm", "sglang", "sim"] and got["engine"] == "vllm"
    vllm = next(m for m in got["memory"] if m["engine"] == "vllm")
    assert vllm["device"] == "gpu" and vllm["kv_bytes"] == 2 * 30 * 3 * 64 * 2 * 4096
    for n in got["placement"]["nodes"]:
        assert n["reason"].startswith("lacks engine vllm (has: "), n
    # The same on the sim engine, which every node runs: it lands.
    assert _preview(cluster, source=f"hf://{deployhub.ST_REPO}", engine="sim")["placement"]["placed"] == 1


def test_a_manifest_is_previewed_as_apply_dry_run_sends_it(cluster: system.System) -> None:
    doc = system.sim_model("dry", replicas=2)
    got = _preview(cluster, manifest=doc)
    assert got["name"] == "dry" and got["metadata"] is None and got["placement"]["placed"] == 2
    assert sorted(n["replicas"] for n in got["placement"]["nodes"]) == [1, 1]  # spread: one each


@pytest.mark.parametrize(("body", "param", "said"), [
    ({"source": GGUF, "engine": "vllm"}, "engine", "vllm cannot load gguf weights; one of llamacpp, sim can"),
    ({"source": "/etc/shadow"}, "source", "no node reports weights at /etc/shadow"),
    ({"source": "test-org/absent"}, "source", "HTTP 404"),
    ({"source": GGUF, "concurrency": 0}, "concurrency", "expected a whole number from 1 to 4096"),
    ({}, "source", "give either source"),
    ({"source": GGUF, "sauce": 1}, "sauce", "not a preview field"),
    # The control plane's reads are guarded as placement's are: no cloud metadata service, no loopback but the hub.
    ({"source": "http://169.254.169.254/latest/model.gguf"}, "source", "169.254.169.254"),
    ({"source": "http://127.0.0.1:1/model.gguf"}, "source", "127.0.0.1"),
])
def test_a_refused_preview_says_which_field_and_why(cluster: system.System, body: dict[str, Any], param: str,
                                                    said: str) -> None:
    resp = cluster.request("POST", "/api/v1/preview", json=body)
    assert resp.status_code == 422, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and said in err["message"], err


def test_the_catalog_lists_the_shipped_models(cluster: system.System) -> None:
    items = cluster.get("/api/v1/catalog")["items"]
    assert len(items) >= 8 and all(i["source"] and i["license"] for i in items)


def _cli(s: system.System, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real `llmgw` CLI, its output through a pipe, as a script reads it."""
    return subprocess.run([*system.LLMGW, *args, "--url", s.url], capture_output=True, text=True, timeout=60,
                          env=s.cli_env(), input=stdin, check=False)


def test_llmgw_plan_prints_metadata_memory_and_each_nodes_reason(cluster: system.System) -> None:
    out = _cli(cluster, "plan", GGUF, "--context-length", "1000000", "--concurrency", "1024")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("model/tiny-llama-f32 on llamacpp (dry run: nothing applied)")
    assert any(line.startswith("weights       format gguf, architecture llama, dtype F32") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.split() == ["NODE", "REPLICAS", "WHY"])
    rows = [line.split(None, 2) for line in lines[header + 1:header + 3]]
    assert [r[:2] for r in rows] == [["node1", "0"], ["node2", "0"]]
    assert all("free memory, needs" in r[2] for r in rows), rows
    assert "placement: 0 of 1 replicas placed" in out.stdout
    # -o yaml: the model file alone, which apply --dry-run reads back and places.
    manifest = _cli(cluster, "plan", GGUF, "--ctx", "2048", "--name", "tiny", "-o", "yaml")
    assert manifest.returncode == 0 and manifest.stdout.startswith("apiVersion: llmgw/v1"), manifest
    dry = _cli(cluster, "apply", "--dry-run", "-f", "-", stdin=manifest.stdout)
    assert dry.returncode == 0, dry.stderr
    assert "model/tiny on llamacpp (dry run: nothing applied)" in dry.stdout
    assert "placement: 1 of 1 replicas placed; each needs " in dry.stdout and "lands here" in dry.stdout
    assert cluster.get("/api/v1/models")["items"] == []


def test_llmgw_catalog_lists_it_in_columns(cluster: system.System) -> None:
    out = _cli(cluster, "catalog")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NAME", "ENGINE", "SIZE", "LICENSE", "SOURCE"]
    names = {line.split()[0] for line in lines[1:]}
    assert {"qwen2.5-0.5b-instruct", "llama-3.1-8b-instruct"} <= names


def test_a_viewer_may_not_preview(cluster: system.System) -> None:
    """A preview makes the control plane read from the hub: an operator's call, as applying is."""
    made = cluster.request("POST", "/api/v1/users", json={"name": "vic", "role": "viewer"})
    assert made.status_code == 201, made.text
    login = cluster.request("POST", "/api/v1/login", json={"username": "vic", "password": made.json()["password"]})
    viewer = {"Authorization": f"Bearer {login.json()['token']}"}
    resp = cluster.request("POST", "/api/v1/preview", json={"source": GGUF}, headers=viewer)
    assert resp.status_code == 403, resp.text
    assert cluster.request("GET", "/api/v1/catalog", headers=viewer).status_code == 200
