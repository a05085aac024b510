"""A standalone router's trust of an https:// control plane (``router.controltls``), against real HTTPS servers
on loopback: the right ``--control-ca-hash`` gives sessions that verify with that CA alone, a wrong one is
refused before anything but the CA's read, ``--control-ca`` is taken as given, the settings refuse what cannot
work (issue 28)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from llmgw.core import pki
from llmgw.router import controltls, workers
from llmgw.router.settings import RouterSettings
from llmgw.testing.tlsserve import serving


@pytest.fixture(scope="module")
def ca() -> pki.Issued:
    return pki.create_ca()


@pytest.fixture(scope="module")
def other_ca() -> pki.Issued:
    return pki.create_ca(name="another cluster")


async def _healthz(url: str, ctx: object) -> int:
    async with controltls.session(ctx) as s, s.get(url + "/healthz") as resp:  # type: ignore[arg-type]
        return resp.status


def test_the_right_hash_gives_sessions_that_verify_with_that_ca_alone(ca: pki.Issued, other_ca: pki.Issued) -> None:
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        ctx = controltls.resolve([server.url], ca_file=None, ca_hash=pki.ca_hash(ca.cert_pem))
        assert ctx is not None
        assert asyncio.run(_healthz(server.url, ctx)) == 200
        # Without the pinned CA the system's authorities refuse the cluster's certificate.
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            asyncio.run(_healthz(server.url, None))
    with serving(pki.server_cert(other_ca, ["127.0.0.1"]), other_ca.cert_pem) as impostor:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            asyncio.run(_healthz(impostor.url, ctx))


def test_a_wrong_hash_stops_the_router_naming_both_and_sends_nothing_else(ca: pki.Issued,
                                                                         other_ca: pki.Issued) -> None:
    wrong = pki.ca_hash(other_ca.cert_pem)
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        with pytest.raises(controltls.TrustError) as refused:
            controltls.resolve([server.url], ca_file=None, ca_hash=wrong)
        assert server.requests == ["GET /api/v1/ca"]
    assert f"serves a CA with hash {pki.ca_hash(ca.cert_pem)}, not the --control-ca-hash {wrong}" in str(refused.value)


def test_a_control_plane_down_at_start_is_waited_for_then_checked(ca: pki.Issued) -> None:
    """The first URL refuses connections: the next one that answers is the one checked; each round sleeps."""
    slept: list[float] = []
    with serving(pki.server_cert(ca, ["127.0.0.1"]), ca.cert_pem) as server:
        dead = "https://127.0.0.1:1"
        ctx = controltls.resolve([dead, server.url], ca_file=None, ca_hash=pki.ca_hash(ca.cert_pem),
                                 sleep=slept.append)
        assert ctx is not None and slept == []
    with pytest.raises(RuntimeError, match="third round"):
        def sleep(s: float) -> None:
            slept.append(s)
            if len(slept) == 3:
                raise RuntimeError("third round")
        controltls.resolve([dead], ca_file=None, ca_hash=pki.ca_hash(ca.cert_pem), sleep=sleep)
    assert slept == [0.2, 0.4, 0.8]


def test_a_ca_file_is_used_as_given_and_a_bad_one_refused(ca: pki.Issued, tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    with serving(pki.server_cert(ca, ["127.0.0.1"]), None) as server:
        ctx = controltls.resolve([server.url], ca_file=tmp_path / "ca.crt", ca_hash="")
        assert asyncio.run(_healthz(server.url, ctx)) == 200
        assert server.requests == ["GET /healthz"]
    (tmp_path / "junk").write_text("junk")
    with pytest.raises(controltls.TrustError, match="is not a PEM certificate"):
        controltls.resolve(["https://h:1"], ca_file=tmp_path / "junk", ca_hash="")
    assert controltls.resolve(["https://h:1"], ca_file=None, ca_hash="") is None  # the system's authorities


def test_the_settings_refuse_what_cannot_work(tmp_path: Path) -> None:
    good = "sha256:" + "ab" * 32
    with pytest.raises(ValueError, match="not both"):
        RouterSettings(control=("https://cp:8080",), control_ca=tmp_path / "ca", control_ca_hash=good)
    with pytest.raises(ValueError, match="for a control plane served over HTTPS"):
        RouterSettings(control=("http://cp:8080",), control_ca_hash=good)
    with pytest.raises(ValueError, match="expected sha256: and 64 hex digits"):
        RouterSettings(control=("https://cp:8080",), control_ca_hash="sha256:xyz")
    made = RouterSettings(control=("https://cp:8080",), control_ca_hash=good, workers=2)
    # A hub's workers follow it over loopback HTTP: the hub alone verifies the control plane.
    values = workers.worker_settings(made, 0, hub_url="http://127.0.0.1:9", port=8080)
    assert "control_ca_hash" not in values and "control_ca" not in values and values["control"] == "http://127.0.0.1:9"
