"""The SSO callback's address (``llmgw.control.ui.callbackurl``): the configured URL, or the request's own host
only when it is one of the server's names on its port; a forged ``Host`` gets no authorization request."""

from __future__ import annotations

import pytest

from llmgw.control.ui.callbackurl import CallbackUrls, UnknownHost

URLS = CallbackUrls.of(names=("0.0.0.0", "llmgw.example.com", "10.0.0.5", ""), port=8080)


def test_a_known_host_on_the_servers_port_is_the_callbacks_host() -> None:
    for host in ("llmgw.example.com:8080", "LLMGW.example.com.:8080", "10.0.0.5:8080", "127.0.0.1:8080",
                 "localhost:8080", "[::1]:8080", "llmgw.example.com"):
        got = URLS.for_request(scheme="http", host=host, root_path="/ui")
        assert got == f"http://{host}/ui/sso/callback", host
    assert URLS.for_request(scheme="https", host="llmgw.example.com", root_path="/ui") == \
        "https://llmgw.example.com/ui/sso/callback"


def test_a_forged_or_foreign_host_is_refused_naming_it_and_the_setting() -> None:
    for host in ("evil.example:8080", "llmgw.example.com.evil.example:8080", "llmgw.example.com:9999",
                 "127.0.0.2:8080", "0.0.0.0:8080", "user@llmgw.example.com:8080", "llmgw.example.com/x", "", "a b"):
        with pytest.raises(UnknownHost) as e:
            URLS.for_request(scheme="http", host=host, root_path="/ui")
        assert "--sso-redirect-url" in str(e.value) and len(str(e.value).split()) > 8, (host, str(e.value))
    with pytest.raises(UnknownHost, match=r"'evil\.example:8080'.*llmgw\.example\.com"):
        URLS.for_request(scheme="http", host="evil.example:8080", root_path="/ui")


def test_a_configured_url_wins_whatever_the_host_said() -> None:
    urls = CallbackUrls.of(redirect_url="https://llmgw.example.com/ui/sso/callback", names=("10.0.0.5",), port=8080)
    for host in ("evil.example", "10.0.0.5:8080", ""):
        assert urls.for_request(scheme="http", host=host, root_path="/ui") == \
            "https://llmgw.example.com/ui/sso/callback"
