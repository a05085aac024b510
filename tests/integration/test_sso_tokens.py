"""ID tokens refused on their signature and on their claims: ``SsoService`` over a real store against the real
OpenID Connect provider (``tests/oidc``), whose discovery document and key set it reads over HTTP.

The tokens are signed here with the provider's own key (the harness is given it), so a wrong issuer, audience,
expiry or nonce is refused on the claim, not on the signature; a forged one is signed with another key under
the provider's key id. Each refusal answers its sentence (never the token) and is in the audit log.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from llmgw.control.auth import Auth
from llmgw.control.sso import SsoConfig, SsoRefused, SsoService
from llmgw.control.sso.config import GroupMapping
from llmgw.control.sso.provider import TokenAnswer
from llmgw.control.store import store as store_mod
from llmgw.control.store.offloop import StoreThread
from llmgw.testing.oidcprovider import OidcProvider


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with OidcProvider(tmp_path_factory.mktemp("idp")) as p:
        yield p


def attempt(tmp_path: Path, idp: OidcProvider, token: str, *, nonce: str | None = "n-1") -> tuple[str, str, list[str]]:
    """Signs in with ``token`` as the provider's answer: (the refusal's code, its sentence, the audit details);
    ("ok", user, details) when it signed in."""
    async def main() -> tuple[str, str, list[str]]:
        store = store_mod.Store.open(tmp_path)
        db = StoreThread(store)
        cfg = SsoConfig(issuer=idp.issuer, client_id=idp.client_id, client_secret=idp.client_secret,
                        mapping=GroupMapping(roles={"llmgw-admins": "admin", "llmgw-viewers": "viewer"}))
        svc = SsoService(cfg, db, Auth(db))
        try:
            try:
                done = await svc.sign_in_tokens(TokenAnswer(id_token=token, refresh_token="r"), nonce=nonce,
                                                session=False, peer="127.0.0.9")
                outcome = ("ok", done.user)
            except SsoRefused as e:
                outcome = (e.code, e.message)
            details = [f"{a.outcome} {a.actor} {a.detail}" for a in store.list_audit(since_id=0, limit=50)]
            return outcome[0], outcome[1], details
        finally:
            await svc.aclose()
            db.close()
            store.close()
    return asyncio.run(main())


def test_a_right_token_signs_in(tmp_path: Path, idp: OidcProvider) -> None:
    """The control: the same path with every claim right signs alice in (so the refusals below are the claims')."""
    code, user, details = attempt(tmp_path, idp, idp.sign(idp.claims("alice", nonce="n-1")))
    assert (code, user) == ("ok", "alice")
    assert any(d.startswith("ok user:alice (sso@127.0.0.9)") for d in details)


@pytest.mark.parametrize(("name", "over", "want_code", "want_words"), [
    ("expired", {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200}, "sso_expired", "has expired"),
    ("wrong audience", {"aud": "another-client", "azp": "another-client"}, "sso_wrong_audience",
     "not for this cluster"),
    ("wrong issuer", {"iss": "http://127.0.0.1:1"}, "sso_wrong_issuer", "was not issued by --sso-issuer"),
    ("other azp", {"aud": ["llmgw", "other"], "azp": "other"}, "sso_wrong_audience", "issued to another client"),
    ("wrong nonce", {"nonce": "n-2"}, "sso_nonce_mismatch", "nonce is not the one this login sent"),
    ("no nonce", {"nonce": None}, "sso_nonce_mismatch", "nonce is not the one this login sent"),
    ("issued in the future", {"iat": int(time.time()) + 3600}, "sso_not_yet_valid", "not valid yet"),
])
def test_a_token_signed_by_the_provider_with_a_wrong_claim_is_refused(
        tmp_path: Path, idp: OidcProvider, name: str, over: dict[str, object], want_code: str,
        want_words: str) -> None:
    token = idp.sign(idp.claims("alice", **{"nonce": "n-1", **over}))
    code, said, details = attempt(tmp_path, idp, token)
    assert code == want_code, (name, said)
    assert want_words in said
    assert token not in said and token[:40] not in said
    refused = [d for d in details if d.startswith("refused sso@127.0.0.9")]
    assert refused and want_code in refused[0] and want_words in refused[0]
    assert not any(d.startswith("ok") for d in details)


def test_a_forged_signature_is_refused(tmp_path: Path, idp: OidcProvider) -> None:
    """Signed with another key under the provider's key id: the signature does not verify."""
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    code, said, details = attempt(tmp_path, idp, idp.sign(idp.claims("alice", nonce="n-1"), key=other))
    assert code == "sso_bad_signature" and "refused as forged" in said
    assert any("sso_bad_signature" in d for d in details)


def test_an_unknown_key_and_an_hmac_token_are_refused(tmp_path: Path, idp: OidcProvider) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    code, said, _ = attempt(tmp_path, idp, idp.sign(idp.claims("alice", nonce="n-1"), key=other, kid="nope"))
    assert code == "sso_unknown_key" and "'nope'" in said
    import jwt  # an HS256 token "signed" with the client secret, which the server holds: proves nothing
    hs = jwt.encode(idp.claims("alice", nonce="n-1"), idp.client_secret, algorithm="HS256")
    code, said, details = attempt(tmp_path / "hs", idp, hs)
    assert code == "sso_bad_algorithm" and "'HS256'" in said
    assert any("sso_bad_algorithm" in d for d in details)
