"""Fetches from the cluster's own mirror over TLS trust the cluster CA beside the system's authorities (issue 28):
the agent's weights, and the control plane's metadata reads, through a real ``llmgw mirror`` serving HTTPS
with a certificate of the cluster CA, each refused without that CA; pip is given a bundle of both for an
https:// index."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import certifi
import pytest

from llmgw.agent import fetch
from llmgw.agent.fetch import trust
from llmgw.agent.provision import pip
from llmgw.control import remotemeta
from llmgw.core import errors, pki, sources
from llmgw.testing import hfrepo, procs, tiny_gguf


@contextlib.contextmanager
def _tls_mirror(tmp: Path, root: Path, ca: pki.Issued) -> Iterator[str]:
    cert = pki.server_cert(ca, ["127.0.0.1"])
    (tmp / "mirror.crt").write_bytes(cert.cert_pem + ca.cert_pem)  # as llmgw server serves its chain
    (tmp / "mirror.key").write_bytes(cert.key_pem)
    (tmp / "mirror.key").chmod(0o600)
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning",
            "--tls-cert", str(tmp / "mirror.crt"), "--tls-key", str(tmp / "mirror.key")]
    with procs.Proc.start(argv, log_path=tmp / "mirror.log") as proc:
        procs.wait_for(lambda: _answers(port) or proc.popen.poll() is not None, timeout=30, what="the mirror's port")
        assert proc.popen.poll() is None, proc.log_tail(20)
        yield f"https://127.0.0.1:{port}"


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _ensure(cache: Path, req: fetch.Request, tls: object) -> str:
    async def go() -> str:
        f = fetch.Fetcher(cache, retry_base_s=0.01, max_attempts=2, tls=tls)  # type: ignore[arg-type]
        try:
            return await f.ensure(req)
        finally:
            await f.close()
    return asyncio.run(go())


def test_weights_through_a_tls_mirror_of_the_cluster_ca(tmp_path: Path) -> None:
    ca = pki.create_ca()
    root = tmp_path / "mirror"
    files = hfrepo.sample_files(seed=5)
    hfrepo.write_repo(root, "org/tiny", files)
    with _tls_mirror(tmp_path, root, ca) as url:
        req = fetch.Request(source=sources.parse("hf://org/tiny"), endpoint=url)
        with pytest.raises(errors.FetchError, match="(?i)certificate"):
            _ensure(tmp_path / "refused", req, trust.context(None))  # the system's authorities alone
        path = Path(_ensure(tmp_path / "cache", req, trust.context(ca.cert_pem)))
    got = {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert got == files


def test_pip_gets_a_bundle_of_the_system_authorities_and_the_cluster_ca(tmp_path: Path) -> None:
    ca = pki.create_ca()
    assert trust.bundle(tmp_path, None) is None  # --insecure: pip keeps its own
    path = trust.bundle(tmp_path, ca.cert_pem)
    assert path == tmp_path / trust.BUNDLE and (path.stat().st_mode & 0o777) == 0o644
    text = path.read_bytes()
    assert text.endswith(ca.cert_pem) and Path(certifi.where()).read_bytes().strip() in text
    https = pip.install_argv(Path("/v/bin/python"), ("vllm",), index_url="https://cp/mirror/simple", find_links=False,
                             ca_bundle=path)
    assert https[https.index("--cert") + 1] == str(path)
    plain = pip.install_argv(Path("/v/bin/python"), ("vllm",), index_url="http://cp/simple", find_links=False,
                             ca_bundle=path)
    assert "--cert" not in plain


def test_the_control_planes_metadata_reads_of_its_own_tls_mirror_trust_the_cluster_ca(tmp_path: Path) -> None:
    ca = pki.create_ca()
    root = tmp_path / "mirror"
    path = tiny_gguf.write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    hfrepo.write_files(root, "tiny", {"tiny.gguf": path.read_bytes()})
    with _tls_mirror(tmp_path, root, ca) as url:
        refused = remotemeta.Reader(mirror_url=url).read("mirror://tiny/tiny.gguf")
        got = remotemeta.Reader(mirror_url=url, cluster_ca=ca.cert_pem).read("mirror://tiny/tiny.gguf")
    assert refused.weight is None and "certificate" in refused.problem.lower(), refused.problem
    assert got.weight is not None, got.problem
    assert got.weight.size_bytes == path.stat().st_size and got.weight.format == "gguf"
