"""Single sign-on through an OpenID Connect provider (issue 28): the UI's authorization code flow with PKCE
and the CLI's device flow, both brokered by the server (the client secret never leaves it).

- ``config``: ``SsoConfig`` (issuer, client, scopes, claims) and ``GroupMapping`` (groups to the cluster role
  and to projects), the client secret read from a file only its owner may read;
- ``discovery``: the provider's discovery document and keys, cached (keys fetched again on an unknown key id);
- ``idtoken``: an ID token verified (signature, iss, aud, azp, exp/iat with leeway, nonce), each refusal a
  sentence;
- ``provider``: the provider's token, device and userinfo endpoints with the client's credentials;
- ``signin``: claims mapped to a user (made or updated, marked ``sso``), a llmgw token or session for it;
- ``service``: ``SsoService``: ``begin``/``finish`` (the UI), ``device_start``/``device_poll`` (the CLI);
- ``refresher``: each SSO user's refresh token used every ``--sso-refresh-interval``, access ended when the
  provider refuses or the groups no longer map;
- ``seal``: refresh tokens sealed at rest; ``audit``: the audit log's lines; ``refusals``: ``SsoRefused``.

The pending flows (state, nonce, PKCE verifier; a device code) and the links live in the store
(``store.sso``), so control planes sharing a database finish what another began.
"""

from llmgw.control.sso.config import GroupMapping, SsoConfig
from llmgw.control.sso.refusals import SsoRefused, SsoUnavailable
from llmgw.control.sso.service import Begun, DevicePending, DeviceStarted, SsoService
from llmgw.control.sso.signin import SignedIn

__all__ = ["Begun", "DevicePending", "DeviceStarted", "GroupMapping", "SignedIn", "SsoConfig", "SsoRefused",
           "SsoService", "SsoUnavailable"]
