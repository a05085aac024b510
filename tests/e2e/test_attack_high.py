"""Issue 24's High item, replayed end to end: an operator's model spec never runs code on a node.

The attacker's path, against a real secure control plane and a real agent (joined, mutual TLS): build a
shared library whose constructor writes a marker file, and an OpenSSL config naming it as a provider, and
first prove the bait works (the sim engine's own program, run with ``OPENSSL_CONF`` as a non-root user,
dlopens it and the marker appears), so that "the marker never appears" below means something. Then, with
an operator's token only:

- a model whose source is the bait's ``http://127.0.0.1:PORT/...`` URL is not fetched (loopback: the SSRF
  sentence on its replica, the server never asked); with the agent allowed to fetch from that host (as if
  it were an outside server) the files are fetched, and what a viewer can read of them (weights, models,
  replicas, events, the agent's log) carries none of their bytes, and the cache path shown is no use: a
  model naming it in ``OPENSSL_CONF`` is refused;
- ``env: {OPENSSL_CONF: ...}`` and ``engine_args: ["--trust-remote-code"]`` are 422s with the field and the
  sentence, and nothing is stored; ``file:`` sources of the server's ``ca.key`` and ``/etc/shadow`` are
  refused without a byte of either anywhere a viewer reads;
- a model stored by an older version with ``OPENSSL_CONF`` (written to the store as it would have been)
  still starts, but its engine runs without the variable (``/proc/PID/environ``), as a uid that is not 0
  (``/proc/PID/status``), and the marker never appears.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from llmgw.control import datadir
from llmgw.core import specs
from llmgw.testing.flakyhttp import FlakyHttp
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, running, sim_model

pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0
NOBODY = 65534

_LIBRARY = r"""
#include <stdio.h>
#include <unistd.h>
/* Runs when the library is loaded: the proof that an engine loaded it, and as whom. */
__attribute__((constructor)) static void bait(void) {
    FILE *f = fopen(MARKER, "a");
    if (f) { fprintf(f, "loaded by uid %d\n", (int)getuid()); fclose(f); }
}
"""
# OpenSSL 3 reads this at its first initialisation (Python's ``import ssl``) and dlopens each provider's
# ``module``; the default provider is activated too, so that the engine would otherwise run unharmed.
_CONFIG = """openssl_conf = openssl_init
[openssl_init]
providers = provider_sect
[provider_sect]
bait = bait_sect
default = default_sect
[bait_sect]
module = {library}
activate = 1
[default_sect]
activate = 1
"""


def _build_bait(d: Path) -> tuple[Path, Path, Path]:
    """The library, its config and the marker's path, in ``d`` (0777: a non-root engine could write the marker)."""
    d.mkdir()
    os.chmod(d, 0o777)
    marker, library, config = d / "marker", d / "libbait.so", d / "bait.cnf"
    (d / "bait.c").write_text(_LIBRARY)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(d / "bait.c")],
                   check=True, capture_output=True, timeout=60)
    config.write_text(_CONFIG.format(library=library))
    return library, config, marker


def _prove_bait(config: Path, marker: Path) -> None:
    """The sim engine's program, as the engines' kind of user, loads the library when given the config."""
    who: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if ROOT else {}
    ran = subprocess.run([sys.executable, "-m", "llmgw.sim.engine", "--help"], cwd=config.parent,
                         env={**os.environ, "OPENSSL_CONF": str(config)}, capture_output=True, text=True, timeout=60,
                         **who)
    assert ran.returncode == 0, ran.stderr
    assert marker.read_text() == f"loaded by uid {NOBODY if ROOT else os.getuid()}\n"
    marker.unlink()


def _token(s: System, name: str, role: str) -> str:
    made = s.request("POST", "/api/v1/users", json={"name": name, "role": role})
    assert made.status_code == 201, made.text
    login = s.request("POST", "/api/v1/login", json={"username": name, "password": made.json()["password"]},
                      headers={"Authorization": ""})
    assert login.status_code == 200, login.text
    return str(login.json()["token"])


def _as(s: System, token: str, method: str, path: str, **kw: Any) -> httpx.Response:
    return s.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)


def _message(s: System, model: str, words: str) -> str | None:
    return next((r["message"] for r in s.replicas(model) if words in r["message"]), None)


def _what_a_viewer_reads(s: System, viewer: str) -> str:
    """Every document a viewer can read about models, replicas, nodes, weights and events, and the agent's log."""
    paths = ["/api/v1/models", "/api/v1/replicas", "/api/v1/events", "/api/v1/weights", "/api/v1/nodes",
             "/api/v1/nodes/node1", "/api/v1/nodes/node1/describe", "/api/v1/nodes/node1/logs?lines=10000"]
    paths += [f"/api/v1/models/{m['metadata']['name']}/describe" for m in s.get("/api/v1/models")["items"]]
    docs = []
    for path in paths:
        r = _as(s, viewer, "GET", path)
        assert r.status_code == 200, (path, r.status_code, r.text)   # read, or the checks on it would be empty
        docs.append(r.text)
    return "\n".join(docs)


def _engine_of(s: System, served_name: str) -> int:
    """The pid of the engine serving ``served_name`` (its argv says ``--model NAME``)."""
    def find() -> int | None:
        for pid in s.engine_pids():
            try:
                argv = psutil.Process(pid).cmdline()
            except psutil.Error:
                continue
            if "llmgw.sim.engine" in argv and argv[argv.index("--model") + 1] == served_name:
                return pid
        return None
    return int(wait_for(find, timeout=30, interval=0.2, what=f"the engine of {served_name}"))  # type: ignore[arg-type]


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text()
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def _uids(pid: int) -> list[int]:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
    return [int(v) for v in line.split()[1:]]


def test_an_operator_cannot_make_a_node_load_a_library(tmp_path: Path) -> None:
    library, config, marker = _build_bait(tmp_path / "bait")
    _prove_bait(config, marker)
    shadow = Path("/etc/shadow").read_text()[:24] if os.access("/etc/shadow", os.R_OK) else ""

    with FlakyHttp(library.parent) as srv, running(tmp_path / "sys") as s:
        operator, viewer = _token(s, "otto", "operator"), _token(s, "vera", "viewer")

        def apply(doc: dict[str, Any]) -> httpx.Response:
            return _as(s, operator, "POST", "/api/v1/models", json=doc)

        # -- The env and the flag: refused at apply, with the field and the sentence; nothing stored.
        r = apply(sim_model("ssl", env={"OPENSSL_CONF": str(config)}))
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "spec.env.OPENSSL_CONF"
        assert r.json()["error"]["message"].startswith(
            "spec.env.OPENSSL_CONF: OPENSSL_CONF would make the engine load or run other code"), r.text
        remote = {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "remote"},
                  "spec": {"engine": "vllm", "source": "hf://attacker/repo", "replicas": 1,
                           "engine_args": ["--trust-remote-code"]}}
        r = apply(remote)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "spec.engine_args[0]"
        assert "makes vllm run or load code" in r.json()["error"]["message"], r.text
        for name in ("ssl", "remote"):
            assert _as(s, viewer, "GET", f"/api/v1/models/{name}").status_code == 404

        # -- Local files the agent must not open for an operator: the CA's key, the password hashes.
        ca_key = s.data_dir / "pki" / "ca.key"
        for name, path in (("keyread", ca_key), ("shadow", Path("/etc/shadow"))):
            r = apply(sim_model(name, source=f"file://{path}"))
            if r.status_code != 201:   # refused at apply is as good as refused by the node
                assert r.status_code == 422 and r.json()["error"]["param"] == "spec.source", r.text
                continue
            said = wait_for(lambda n=name: _message(s, n, "source roots"), timeout=60, interval=0.3,
                            what=f"the {name} replica refused by the node")
            assert f"spec.source {path} is outside this node's source roots (" in str(said), said

        # -- The bait by URL: loopback is refused by default, and the server is never asked.
        apply(sim_model("bait-conf", source=f"{srv.url}/{config.name}"))
        apply(sim_model("bait-lib", source=f"{srv.url}/{library.name}"))
        for name in ("bait-conf", "bait-lib"):
            # The node's refusal (the control plane's own metadata read is refused too, in its own words).
            said = wait_for(lambda n=name: _message(s, n, "fetch_allow_private in the agent's settings"),
                            timeout=60, interval=0.3, what=f"the {name} replica refused by the node")
            assert "127.0.0.1 is a loopback address; nothing is fetched from loopback" in str(said), said
            assert f"allow {srv.allowed} with fetch_allow_private in the agent's settings" in str(said), said
        assert srv.seen == []

        # -- An older version's store: a model that set OPENSSL_CONF, written as it was accepted then.
        s.stop_agent("node1")
        s.stop_server()
        legacy = sim_model("legacy", env={"OPENSSL_CONF": str(config), "OMP_NUM_THREADS": "1"})
        store = datadir.open_store(s.data_dir, s.database)
        try:
            store.put_model(specs.parse_manifest(legacy, stored=True))
        finally:
            store.close()
        s.start_server()
        # The agent may now fetch from the bait's server, as it would from a host outside.
        s.agent_env["LLMGW_AGENT_FETCH_ALLOW_PRIVATE"] = srv.allowed
        s.start_agent("node1")

        # The old model runs, without the variable, not as root, and the library never loads.
        s.wait_model("legacy", timeout=60)
        pid = _engine_of(s, "legacy")
        assert not marker.exists(), marker.read_text()   # Ready: it has imported ssl, and loaded no library
        env = _environ(pid)
        assert "OPENSSL_CONF" not in env and env["OMP_NUM_THREADS"] == "1", sorted(env)
        assert all(u != 0 for u in _uids(pid)), _uids(pid)
        said = (tmp_path / "sys" / "agent-node1.log").read_text()
        assert "its env sets OPENSSL_CONF, which a model may not set" in said

        # The bait is fetched now (the sim engine loads no model file: its replicas run), into the cache at a
        # path an attacker can work out (and a viewer can read): no model may name it.
        for name in ("bait-conf", "bait-lib"):
            s.wait_model(name, timeout=60)
        assert srv.count("GET", f"/{config.name}") >= 1 and srv.count("GET", f"/{library.name}") >= 1
        weights = tmp_path / "sys" / "node1" / "weights"
        cached_conf = next(weights.glob(f"*/{config.name}"))
        cached_lib = next(weights.glob(f"*/{library.name}"))
        for key, value in (("OPENSSL_CONF", cached_conf), ("OPENSSL_MODULES", cached_lib.parent),
                           ("LD_PRELOAD", cached_lib)):
            r = apply(sim_model("ssl", env={key: str(value)}))
            assert r.status_code == 422 and r.json()["error"]["param"] == f"spec.env.{key}", r.text
        assert _as(s, viewer, "GET", "/api/v1/models/ssl").status_code == 404
        shown = _what_a_viewer_reads(s, viewer)
        # Neither file's bytes: the config's sections, the library's strings.
        assert "openssl_init" not in shown and "module = " not in shown and "loaded by uid" not in shown
        assert "PRIVATE KEY" not in shown and ca_key.read_text()[40:80] not in shown
        assert not shadow or shadow not in shown
        assert not marker.exists()
