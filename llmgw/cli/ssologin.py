"""``llmgw login --sso``: the device authorization flow, brokered by the control plane.

The CLI never talks to the identity provider and never holds the client secret: it asks the control plane
to begin (``POST /api/v1/sso/device``), prints the page and the code for the user to enter in any browser,
and polls ``POST /api/v1/sso/device/token`` at the interval the provider asked for until the sign-in is
approved (a llmgw token, saved in the context as a password login's is), refused, or expired.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llmgw.cli import client as client_mod
from llmgw.cli import contexts
from llmgw.core.errors import LlmgwError


def sign_in(name: str, urls: list[str], *, echo: Callable[[str], None],
            sleep: Callable[[float], None] = time.sleep, ca: str = "") -> contexts.Context:
    """Signs in through the server's identity provider and saves the token in context ``name`` (made current).
    ``ca``: the cluster CA the server was verified with (``cli.trust``), kept in the context. LlmgwError with the
    server's sentence when refused or expired."""
    c = client_mod.Client(urls[0], token="", urls=urls, ca=ca)
    try:
        _, start = c.request("POST", "/api/v1/sso/device")
        echo(f"To sign in, open {start['verification_uri']} in a browser and enter the code {start['user_code']}")
        if start.get("verification_uri_complete") and start["verification_uri_complete"] != start["verification_uri"]:
            echo(f"  (or open {start['verification_uri_complete']}, which has the code in it)")
        echo(f"waiting for the sign-in to be approved (the code expires in {float(start['expires_in']):.0f}s)...")
        deadline = time.monotonic() + float(start["expires_in"]) + 5
        interval = max(1.0, float(start.get("interval") or 5))
        while True:
            sleep(interval)
            _, doc = c.request("POST", "/api/v1/sso/device/token", json={"handle": start["handle"]})
            if doc.get("status") == "approved":
                break
            interval = max(1.0, float(doc.get("interval") or interval))
            if time.monotonic() > deadline:
                raise LlmgwError("the code was not approved before it expired: run `llmgw login --sso` again")
    finally:
        c.close()
    creds = contexts.read()
    ctx = contexts.Context(name, urls, doc["user"], doc["token"], ca)
    creds.contexts[name] = ctx
    creds.current = name
    path = contexts.write(creds)
    echo(f"signed in to {c.url} as {doc['user']} through single sign-on (role {doc['role']}); context {name} "
         f"(current, control planes {', '.join(urls)}) saved in {path}")
    return ctx
