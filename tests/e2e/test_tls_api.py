"""HTTPS on ``llmgw server``'s HTTP port (issue 28), on real processes over real TLS on 127.0.0.1.

- ``--tls`` with a cluster-CA certificate: curl without the CA is refused (verify failure), with
  ``--cacert DATA_DIR/pki/ca.crt`` served; the ``openai`` client trusting the CA gets a chat completion from a
  sim model; REST, UI and /v1 answers carry HSTS and the session cookie is ``Secure`` (a UI login too);
- plain loopback: neither HSTS nor a ``Secure`` cookie;
- the operator's ``--tls-cert/--tls-key`` rewritten (new key and certificate over the old, as a renewal does)
  under steady load (~50 requests/s, half streamed, each on a new connection) with ``--router-workers 2``: no
  request fails, both processes reload, and new connections see the new certificate's serial;
- a cluster-CA certificate past two thirds of a short ``--tls-cert-validity`` is issued again under load,
  without a failed request, and the worker serves it too; logins through either process get a Secure cookie.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509

from llmgw.core import pki
from llmgw.testing.load import Load
from llmgw.testing.procs import wait_for
from llmgw.testing.system import System, sim_model

CURL = shutil.which("curl") or "/usr/bin/curl"
MODEL = "m"


def serial_of_new_connection(port: int, ca_file: Path) -> int:
    """The serial of the certificate a new TLS connection to 127.0.0.1:port is served (verified with ``ca_file``)."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


@contextlib.contextmanager
def _serving(root: Path, *, args: list[str], https: bool = True, ca_file: Path | None = None,
             model: bool = True) -> Iterator[System]:
    s = System(root, server_args=args, https=https, ca_file=ca_file)
    try:
        s.start_server()
        if model:
            s.start_agent("node1")
            s.apply(sim_model(MODEL, args=["--decode-tps", "2000"]))
            s.wait_model(MODEL, timeout=60)
            s.wait_router(MODEL, 1, timeout=30)
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def tls_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with _serving(tmp_path_factory.mktemp("tls"), args=["--tls", "--router-workers", "1"]) as s:
        yield s


def test_curl_without_the_cluster_ca_is_refused_and_with_it_served(tls_system: System) -> None:
    url = f"{tls_system.url}/healthz"
    refused = subprocess.run([CURL, "-sS", url], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 60, (refused.returncode, refused.stderr)   # CURLE_PEER_FAILED_VERIFICATION
    assert "certificate" in refused.stderr.lower()
    served = subprocess.run([CURL, "-sS", "-i", "--cacert", str(tls_system.data_dir / "pki" / "ca.crt"), url],
                            capture_output=True, text=True, timeout=30)
    assert served.returncode == 0, served.stderr
    assert served.stdout.startswith("HTTP/1.1 200") and '"status":"ok"' in served.stdout
    assert "strict-transport-security: max-age=31536000" in served.stdout.lower()
    # The chain is served (leaf, then the cluster CA), and the leaf is the API certificate in the data directory.
    api_crt = (tls_system.data_dir / "pki" / "api.crt").read_bytes()
    assert api_crt.count(b"BEGIN CERTIFICATE") == 2
    assert serial_of_new_connection(tls_system.http_port, tls_system.ca_file) == pki.load_cert(api_crt).serial_number
    assert "https://127.0.0.1" in tls_system.server.log_tail(200)   # type: ignore[union-attr]
    assert pki.ca_hash((tls_system.data_dir / "pki" / "ca.crt").read_bytes()) in \
        tls_system.server.log_tail(200)   # type: ignore[union-attr]


def test_the_openai_client_trusting_the_cluster_ca_gets_a_chat_completion(tls_system: System) -> None:
    with httpx.Client(verify=str(tls_system.ca_file)) as http:
        client = openai.OpenAI(base_url=f"{tls_system.url}/v1", api_key="unused", http_client=http)
        done = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=8)
        assert done.choices[0].message.content
        raw = client.chat.completions.with_raw_response.create(model=MODEL, max_tokens=2,
                                                                messages=[{"role": "user", "content": "x"}])
        # /v1 answers carry HSTS too: it is in the server's cached header line, at no cost per answer.
        assert raw.headers.get("strict-transport-security") == "max-age=31536000"
    # Without the CA the client refuses the server.
    with httpx.Client() as http, pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=f"{tls_system.url}/v1", api_key="unused", http_client=http,
                      max_retries=0).models.list()


def test_https_answers_carry_hsts_and_the_session_cookie_is_secure(tls_system: System) -> None:
    r = tls_system.request("POST", "/api/v1/login", json={"username": "admin", "password": tls_system.admin_password,
                                                           "session": True})
    assert r.status_code == 200, r.text
    assert r.headers["strict-transport-security"] == "max-age=31536000"
    assert "; secure" in r.headers["set-cookie"].lower(), r.headers["set-cookie"]
    # The UI's login form, whose in-process call to the API is made over the browser's scheme.
    with httpx.Client(base_url=tls_system.url, verify=str(tls_system.ca_file), trust_env=False) as c:
        page = c.post("/ui/login", data={"username": "admin", "password": tls_system.admin_password},
                      headers={"Origin": tls_system.url})
    assert page.status_code == 303, page.text
    assert "; secure" in page.headers["set-cookie"].lower(), page.headers["set-cookie"]
    assert page.headers["strict-transport-security"] == "max-age=31536000"
    # That session is the browser's alone: a caller with no cookie still goes to the login (the UI's one in-process
    # client to the API keeps no cookie jar; one did, and over HTTPS it sent the last login's cookie for everyone).
    with httpx.Client(base_url=tls_system.url, verify=str(tls_system.ca_file), trust_env=False) as anon:
        for path in ("/ui/", "/ui/nodes", "/ui/keys"):
            got = anon.get(path)
            assert got.status_code == 303 and got.headers["location"] == "/ui/login", (path, got.status_code)


def test_plain_loopback_has_neither_hsts_nor_a_secure_cookie(tmp_path: Path) -> None:
    with _serving(tmp_path, args=["--router-workers", "1"], https=False, model=False) as s:
        r = s.request("POST", "/api/v1/login", json={"username": "admin", "password": s.admin_password,
                                                      "session": True})
        assert r.status_code == 200, r.text
        assert "strict-transport-security" not in r.headers
        assert "secure" not in r.headers["set-cookie"].lower(), r.headers["set-cookie"]
        assert "x-llmgw-plain-http" not in r.headers   # loopback is plain by design: nothing to mark


def _operator_pair(directory: Path, ca: pki.Issued) -> int:
    """An operator's renewal: a new key and certificate written over the old files, in place; the new serial."""
    issued = pki.server_cert(ca, ["127.0.0.1"])
    (directory / "server.pem").write_bytes(issued.cert_pem + ca.cert_pem)
    (directory / "server.key").write_bytes(issued.key_pem)
    return pki.load_cert(issued.cert_pem).serial_number


def _reloads(s: System) -> list[str]:
    assert s.server is not None
    return [line for line in s.server.log_tail(2000).splitlines() if "TLS certificate reloaded" in line]


def test_the_operators_certificate_rotated_under_load_fails_no_request_and_both_processes_reload(
        tmp_path: Path) -> None:
    # The operator's own CA stands for a public one: the cluster CA is not what clients trust here.
    public = pki.create_ca(name="a public CA")
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(public.cert_pem)
    first = _operator_pair(certs, public)
    (certs / "server.key").chmod(0o600)
    args = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"), "--router-workers", "2"]
    with _serving(tmp_path / "sys", args=args, ca_file=certs / "ca.crt") as s:
        assert serial_of_new_connection(s.http_port, certs / "ca.crt") == first
        # The worker listening (it loaded the first pair) before the files change.
        wait_for(lambda: "router on https://" in s.server.log_tail(2000), timeout=30,  # type: ignore[union-attr]
                 what="the worker up")
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        # 4 clients, each a request every 80 ms on a new connection: ~50 requests/s, half streamed.
        with Load(s.url, MODEL, clients=4, verify=ctx, pace_s=0.08, fresh_connections=True) as load:
            load.wait_ok(60)
            second = _operator_pair(certs, public)
            # Both processes (the server and its worker, whose lines name it) load the new pair.
            wait_for(lambda: len(_reloads(s)) >= 2, timeout=20, what="both processes reloaded")
            load.wait_ok(100)
        assert not load.failures, load.failures[:5]
        assert load.ok >= 160 and load.streamed >= 60, (load.ok, load.streamed)
        lines = _reloads(s)
        assert len(lines) == 2 and sum(".w0]" in line for line in lines) == 1, lines
        # New connections, whichever process accepts them, are served the new certificate.
        assert {serial_of_new_connection(s.http_port, certs / "ca.crt") for _ in range(20)} == {second}


def test_a_cluster_ca_certificate_past_two_thirds_is_issued_again_under_load(tmp_path: Path) -> None:
    args = ["--tls", "--tls-cert-validity", "12s", "--router-workers", "2"]
    with _serving(tmp_path, args=args) as s:
        api_crt = s.data_dir / "pki" / "api.crt"
        first = pki.load_cert(api_crt.read_bytes()).serial_number
        with Load(s.url, MODEL, clients=2, verify=s.ssl_context() or True, pace_s=0.1,
                  fresh_connections=True) as load:
            wait_for(lambda: pki.load_cert(api_crt.read_bytes()).serial_number != first, timeout=30,
                     what="api.crt issued again")
            renewed = pki.load_cert(api_crt.read_bytes()).serial_number
            wait_for(lambda: sum(".w0]" in line for line in _reloads(s)) >= 1, timeout=10,
                     what="the worker reloaded")
            load.wait_ok(20)
        assert not load.failures, load.failures[:5]
        assert {serial_of_new_connection(s.http_port, s.ca_file) for _ in range(10)} <= {
            renewed, pki.load_cert(api_crt.read_bytes()).serial_number}
        assert "issued the HTTP port's certificate from the cluster CA (it is past two thirds" in \
            s.server.log_tail(2000)   # type: ignore[union-attr]
        assert (s.data_dir / "pki" / "api.key").stat().st_mode & 0o777 == 0o600
        # Logins on new connections, whichever process accepts them (a worker passes them to the server with the
        # scheme it was reached by): the session cookie is Secure every time.
        for _ in range(6):
            r = s.request("POST", "/api/v1/login", json={"username": "admin", "password": s.admin_password,
                                                         "session": True})
            assert r.status_code == 200 and "; secure" in r.headers["set-cookie"].lower(), r.headers
            assert r.headers.get_list("strict-transport-security") == ["max-age=31536000"]   # once, not twice
