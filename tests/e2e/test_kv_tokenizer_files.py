"""A kv_aware model's tokenizer files, from its source through a real ``llmgw server`` to a router's credential.

The server serves its own mirror (``--mirror-dir``), which holds an hf:// repository and a mirror:// folder
with the tiny Llama's tokenizer files. The table names each kv_aware model's tokenizer version; a router's
credential fetches the files over HTTP (``usagehttp.ControlCalls.tokenizer``, the standalone router's
transport) and the router's tokenizer built from them gives vLLM's ids (``tests/fixtures/kvtok``). A model
that is not kv_aware, a source without ``tokenizer.json`` and a model that does not exist are refused with
a sentence; a user's token reads the files too, no credential reads nothing, and a router's credential
still reaches nothing else.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from llmgw.core import skew
from llmgw.core.version import version as llmgw_version
from llmgw.router import tokenizer as rtok
from llmgw.router import tokenizers, usagehttp
from llmgw.testing import hfrepo
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

FIXTURES = Path(__file__).parents[1] / "fixtures/kvtok"
TINY = {v["name"]: v for v in json.loads((FIXTURES / "cases.json").read_text())["variants"]}["tiny"]
FILES = {"tokenizer.json": (FIXTURES / "tiny/tokenizer.json").read_bytes(),
         "tokenizer_config.json": json.dumps(TINY["tokenizer_config"]).encode(),
         "chat_template.jinja": TINY["chat_template"].encode(), "config.json": b"{}"}


def _mirror(root: Path) -> Path:
    hfrepo.write_repo(root, "org/tiny", FILES)
    hfrepo.write_repo(root, "org/bare", {"config.json": b"{}"})
    folder = root / "files" / "tinyfiles"
    folder.mkdir(parents=True)
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    return root


def test_routers_fetch_a_kv_aware_models_tokenizer_files_from_the_control_plane(tmp_path: Path) -> None:
    mirror = _mirror(tmp_path / "mirror")
    s = System(tmp_path / "sys", server_args=["--mirror-dir", str(mirror)])
    try:
        s.start_server()
        for name, source, routing in (("hfm", "hf://org/tiny", "kv_aware"),
                                      ("mirm", "mirror://tinyfiles", "kv_aware"),
                                      ("bare", "hf://org/bare", "kv_aware"),
                                      ("plain", "hf://org/tiny", "prefix_cache")):
            s.apply(sim_model(name, replicas=0, source=source, routing=routing))
        router_token = s.request("POST", "/api/v1/routers", json={"name": "edge"}).json()["token"]
        as_router = {"Authorization": f"Bearer {router_token}"}
        said = skew.headers(skew.PROTOCOL, llmgw_version())  # a router says its protocol, or it is refused as too old
        table = {m["name"]: m for m in
                 s.request("GET", "/api/v1/endpoints", headers={**as_router, **said}).json()["models"]}
        assert table["hfm"]["tokenizer"] == "hf://org/tiny"
        assert table["mirm"]["tokenizer"] == "mirror://tinyfiles"
        assert "tokenizer" not in table["plain"]  # not kv_aware: nothing offered, nothing fetched

        async def fetch(model: str) -> tokenizers.TokenizerFiles:
            calls = usagehttp.ControlCalls(s.url, headers=as_router)
            try:
                return await calls.tokenizer(model)
            finally:
                await calls.stop()

        for model, version in (("hfm", "hf://org/tiny"), ("mirm", "mirror://tinyfiles")):
            files = asyncio.run(fetch(model))
            assert files.version == version
            assert files.tokenizer_json == FILES["tokenizer.json"]
            assert files.chat_template == TINY["chat_template"]
            tok = rtok.ModelTokenizer(files.tokenizer_json, files.tokenizer_config, files.chat_template)
            chat = TINY["chats"][1]
            assert tok.chat_ids({"messages": chat["messages"]}) == tuple(chat["ids"])

        for model, says in (("plain", "offers no tokenizer to routers"), ("bare", "has no tokenizer.json"),
                            ("ghost", "does not exist")):
            refused = s.request("GET", f"/api/v1/router/tokenizer/{model}", headers=as_router)
            assert refused.status_code == 404, refused.text
            assert says in refused.json()["error"]["message"]
            try:
                asyncio.run(fetch(model))
            except usagehttp.CallFailed as exc:
                assert "HTTP 404" in str(exc) and says in str(exc)
            else:
                raise AssertionError(f"fetched {model}")
        assert s.request("GET", "/api/v1/router/tokenizer/hfm").status_code == 200  # a user's token reads it too
        with httpx.Client(base_url=s.url, trust_env=False) as anonymous:  # no credential: nothing read
            assert anonymous.get("/api/v1/router/tokenizer/hfm").status_code == 401
        elsewhere = s.request("GET", "/api/v1/models", headers=as_router)
        assert elsewhere.status_code == 403 and "GET /api/v1/router/tokenizer/MODEL" in elsewhere.text
    finally:
        s.close()



def test_router_workers_load_the_tokenizer_through_the_servers_hub(tmp_path: Path) -> None:
    """``llmgw server --router-workers 2``: each worker fetches the files through the server's own hub."""
    s = System(tmp_path / "sys", server_args=["--mirror-dir", str(_mirror(tmp_path / "mirror")),
                                              "--router-workers", "2"])
    try:
        s.start_server()
        s.apply(sim_model("hfm", replicas=0, source="hf://org/tiny", routing="kv_aware"))
        s.apply(sim_model("plain", replicas=0, source="hf://org/tiny", routing="prefix_cache"))
        log = s.root / "server.log"
        body = {"model": "hfm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

        def loaded() -> bool:
            # Each request to the model (no replica: answered 503) starts the load in the worker it reached; a new
            # connection each time, so the kernel spreads them over both workers (SO_REUSEPORT).
            with httpx.Client(base_url=s.url, trust_env=False, timeout=30) as c:
                c.post("/v1/chat/completions", json=body)
                c.post("/v1/chat/completions", json={**body, "model": "plain"})
            return log.read_text(errors="replace").count("hfm's tokenizer loaded (hf://org/tiny)") >= 2

        wait_for(loaded, timeout=60, interval=0.1, what="both workers loading hfm's tokenizer")
        text = log.read_text(errors="replace")
        assert "cannot load" not in text and "plain's tokenizer" not in text  # not kv_aware: never fetched
    finally:
        s.close()
