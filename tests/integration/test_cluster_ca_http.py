"""``GET /api/v1/ca`` and ``/api/v1/ca.crt`` on a real secure server over HTTPS: no credential needed, the CA's
certificate and the hash join commands carry, never a key (issue 28)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from llmgw.core import pki
from llmgw.testing.system import System


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = System(tmp_path_factory.mktemp("ca"), server_args=["--tls"], https=True)
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def _client(s: System) -> httpx.Client:
    return httpx.Client(base_url=s.url, timeout=30, trust_env=False, verify=s.ssl_context() or True)


def test_the_ca_is_served_without_a_credential_with_its_hash_and_no_key(system: System) -> None:
    with _client(system) as http:
        doc = http.get("/api/v1/ca")
        pem = http.get("/api/v1/ca.crt")
        refused = http.get("/api/v1/models")
    assert refused.status_code == 401  # the API still needs a credential; only the CA does not
    assert doc.status_code == 200, doc.text
    body = doc.json()
    on_disk = (system.data_dir / "pki" / "ca.crt").read_bytes()
    assert body["pem"].encode() == on_disk
    assert body["ca_hash"] == system.ca_hash == pki.ca_hash(on_disk)
    assert pem.status_code == 200 and pem.content == on_disk
    assert pem.headers["content-type"].startswith("application/x-pem-file")
    assert "PRIVATE KEY" not in doc.text and "PRIVATE KEY" not in pem.text
