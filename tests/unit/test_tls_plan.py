"""When ``llmgw server``'s HTTP port speaks TLS (``serving.config.tls_plan``), and when its certificate is issued
again (``serving.apicert.why_issue``): pure decisions on the flags and on the certificate's bytes."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from llmgw.core import pki
from llmgw.core.errors import LlmgwError
from llmgw.router import httphead
from llmgw.serving import apicert
from llmgw.serving.config import PLAIN_HTTP_HEADER, tls_plan
from llmgw.serving.settings import ServerSettings

CERT, KEY = Path("/etc/llmgw/api.crt"), Path("/etc/llmgw/api.key")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "ctl.example.com", "[fd00::1]"])
def test_beyond_loopback_without_plain_http_the_port_speaks_tls_from_the_cluster_ca(host: str) -> None:
    plan = tls_plan(host=host)
    assert plan.on and plan.cluster_ca and plan.scheme == "https"
    assert not plan.marked_plain and not plan.warning


def test_beyond_loopback_with_plain_http_it_is_plain_warned_and_marked() -> None:
    plan = tls_plan(host="0.0.0.0", plain_http=True)
    assert not plan.on and plan.scheme == "http" and plan.marked_plain
    assert "--plain-http" in plan.warning and "TLS-terminating proxy" in plan.warning
    assert PLAIN_HTTP_HEADER in plan.warning
    # The mark every answer carries is the header the warning names.
    assert httphead.PLAIN_HTTP_MARK[0].decode() == PLAIN_HTTP_HEADER.lower()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_stays_plain_unless_asked(host: str) -> None:
    assert not tls_plan(host=host).on
    assert not tls_plan(host=host).marked_plain  # nothing to mark on loopback
    assert tls_plan(host=host, tls=True).cluster_ca
    assert tls_plan(host=host, tls_san=("api.example.com",)).cluster_ca
    files = tls_plan(host=host, tls_cert=CERT, tls_key=KEY)
    assert files.on and not files.cluster_ca and (files.cert, files.key) == (CERT, KEY)


def test_the_operators_files_beyond_loopback() -> None:
    plan = tls_plan(host="0.0.0.0", tls_cert=CERT, tls_key=KEY)
    assert plan.on and plan.cert == CERT and not plan.cluster_ca


@pytest.mark.parametrize("kw, flag", [
    ({"tls_cert": CERT}, "--tls-cert needs --tls-key"),
    ({"tls_key": KEY}, "--tls-key needs --tls-cert"),
    ({"plain_http": True, "tls": True}, "--plain-http and --tls contradict"),
    ({"plain_http": True, "tls_cert": CERT, "tls_key": KEY}, "--plain-http and --tls-cert contradict"),
    ({"plain_http": True, "tls_san": ("a.example",)}, "--plain-http and --tls-san contradict"),
    ({"tls_cert": CERT, "tls_key": KEY, "tls_san": ("a.example",)}, "leave --tls-san out"),
    ({"insecure": True, "tls": True}, "--insecure and --tls"),
    ({"insecure": True, "tls_san": ("a.example",)}, "--insecure and --tls-san"),
])
def test_contradictions_are_refused_naming_the_flag(kw: dict[str, object], flag: str) -> None:
    with pytest.raises(LlmgwError, match=flag):
        tls_plan(host="127.0.0.1", **kw)  # type: ignore[arg-type]


def test_insecure_on_loopback_may_take_the_operators_files() -> None:
    plan = tls_plan(host="127.0.0.1", insecure=True, tls_cert=CERT, tls_key=KEY)
    assert plan.on and plan.cert == CERT


def test_the_settings_make_the_plan_with_the_validity() -> None:
    from llmgw.serving.config import config_of

    cfg = config_of(ServerSettings(host="0.0.0.0", tls_san=("api.example.com",), tls_cert_validity="30d"), {},
                    default_data_dir=Path("/nonexistent"))
    assert cfg.tls.on and cfg.tls.sans == ("api.example.com",) and cfg.tls.validity_s == 30 * 86400
    with pytest.raises(ValueError, match="--tls-cert-validity"):
        ServerSettings(tls_cert_validity="0s")


# -- when the cluster-CA certificate is issued again --------------------------------------------------------

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DAY = 86400.0


@pytest.fixture(scope="module")
def ca() -> pki.Issued:
    return pki.create_ca(now=NOW - datetime.timedelta(days=1))


def _issued(ca: pki.Issued, hosts: list[str], validity_s: float) -> bytes:
    return pki.server_cert(ca, hosts, now=NOW, validity=datetime.timedelta(seconds=validity_s)).cert_pem


def test_a_fresh_certificate_for_the_same_names_is_kept(ca: pki.Issued) -> None:
    cert = _issued(ca, ["ctl.example.com", "10.0.0.5"], 90 * DAY)
    assert apicert.why_issue(cert, ca.cert_pem, ["ctl.example.com", "10.0.0.5"], 90 * DAY, NOW) == ""
    # ... until past two thirds of its life, then issued again.
    assert apicert.why_issue(cert, ca.cert_pem, ["ctl.example.com", "10.0.0.5"], 90 * DAY,
                             NOW + datetime.timedelta(days=59)) == ""
    assert "two thirds" in apicert.why_issue(cert, ca.cert_pem, ["ctl.example.com", "10.0.0.5"], 90 * DAY,
                                             NOW + datetime.timedelta(days=61))
    assert "expired" in apicert.why_issue(cert, ca.cert_pem, ["ctl.example.com", "10.0.0.5"], 90 * DAY,
                                          NOW + datetime.timedelta(days=91))


def test_new_names_another_ca_none_or_a_shorter_validity_issue_it_again(ca: pki.Issued) -> None:
    cert = _issued(ca, ["ctl.example.com"], 90 * DAY)
    assert "names changed" in apicert.why_issue(cert, ca.cert_pem, ["ctl.example.com", "api.example.com"],
                                                90 * DAY, NOW)
    other = pki.create_ca(now=NOW - datetime.timedelta(days=1))
    assert "not issued by this cluster's CA" in apicert.why_issue(cert, other.cert_pem, ["ctl.example.com"],
                                                                  90 * DAY, NOW)
    assert apicert.why_issue(None, ca.cert_pem, ["ctl.example.com"], 90 * DAY, NOW) == "there is none yet"
    assert "longer than --tls-cert-validity" in apicert.why_issue(cert, ca.cert_pem, ["ctl.example.com"],
                                                                  30 * DAY, NOW)


def test_names_put_the_advertised_address_and_sans_first_and_a_wildcard_becomes_the_fqdn() -> None:
    import socket

    assert apicert.names(host="10.0.0.5", advertise="ctl.example.com", sans=("api.example.com", "10.0.0.5")) == [
        "ctl.example.com", "api.example.com", "10.0.0.5"]
    assert apicert.names(host="0.0.0.0", advertise="", sans=()) == [socket.getfqdn()]
    assert apicert.names(host="[fd00::1]", advertise="", sans=()) == ["fd00::1"]
