"""An ID token verified: its signature with the provider's key, then its claims (OpenID Connect Core 3.1.3.7).

Each failure is an ``SsoRefused`` with its own code and sentence: a forged signature, an unknown key, an
expired token, a wrong issuer, audience or authorized party, a nonce that is not the one this login sent.
The token itself is never in a sentence.
"""

from __future__ import annotations

import hmac
from typing import Any

import jwt

from llmgw.control.sso.discovery import Discovery
from llmgw.control.sso.refusals import SsoRefused

#: The algorithms accepted: asymmetric only (an HS256 token would be signed with the client secret, which
#: this server also holds: it proves nothing about the provider).
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


async def verify(token: str, *, discovery: Discovery, client_id: str, nonce: str | None,
                 leeway_s: float) -> dict[str, Any]:
    """The token's claims when it is the provider's, for this client, current, and (``nonce`` not None) for this
    login; SsoRefused otherwise. A refreshed token has no nonce to match (``nonce=None``)."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise SsoRefused("sso_malformed_token", "the identity provider's ID token is not a JWT; sign in again") \
            from None
    alg, kid = header.get("alg", ""), str(header.get("kid", ""))
    if alg not in ALGORITHMS:
        raise SsoRefused("sso_bad_algorithm", f"the ID token is signed with {alg!r}, which this server does not "
                         f"accept (only {', '.join(ALGORITHMS)}); configure the provider's client to sign ID "
                         "tokens with RS256")
    key = await discovery.key(kid)
    if key is None:
        raise SsoRefused("sso_unknown_key", f"the ID token is signed with key {kid!r}, which is not in the identity "
                         "provider's key set: refused as forged")
    options: Any = {"require": ["iss", "aud", "exp", "iat", "sub"], "verify_iat": True}
    issuer = (await discovery.metadata()).issuer
    try:
        claims: dict[str, Any] = jwt.decode(token, key=key, algorithms=[alg], audience=client_id, issuer=issuer,
                                            leeway=leeway_s, options=options)
    except jwt.InvalidSignatureError:
        raise SsoRefused("sso_bad_signature", "the ID token's signature does not verify with the identity "
                         "provider's key: refused as forged") from None
    except jwt.ExpiredSignatureError:
        raise SsoRefused("sso_expired", "the ID token has expired (exp is in the past, beyond "
                         f"{leeway_s:.0f}s of clock difference): sign in again, and check both clocks") from None
    except jwt.InvalidAudienceError:
        raise SsoRefused("sso_wrong_audience", f"the ID token is not for this cluster: its audience is not "
                         f"--sso-client-id {client_id!r}") from None
    except jwt.InvalidIssuerError:
        raise SsoRefused("sso_wrong_issuer", f"the ID token was not issued by --sso-issuer {discovery.issuer}: "
                         "refused") from None
    except jwt.ImmatureSignatureError:
        raise SsoRefused("sso_not_yet_valid", "the ID token is not valid yet (iat or nbf in the future beyond "
                         f"{leeway_s:.0f}s): check the clocks of this server and the provider") from None
    except jwt.MissingRequiredClaimError as e:
        raise SsoRefused("sso_missing_claim", f"the ID token lacks the {e.claim!r} claim") from None
    except jwt.PyJWTError as e:
        raise SsoRefused("sso_invalid_token", f"the ID token is not valid: {type(e).__name__}") from None
    aud = claims.get("aud")
    azp = claims.get("azp")
    if (isinstance(aud, list) and len(aud) > 1 and azp is None) or (azp is not None and azp != client_id):
        raise SsoRefused("sso_wrong_audience", f"the ID token was issued to another client (azp {azp!r}), not "
                         f"--sso-client-id {client_id!r}")
    if nonce is not None and not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
        raise SsoRefused("sso_nonce_mismatch", "the ID token's nonce is not the one this login sent: refused as a "
                         "replayed or injected token; sign in again")
    return claims
