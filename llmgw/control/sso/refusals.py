"""Why a single sign-on was refused: one exception with a code (the API's error code) and a sentence.

The sentence says what was wrong and what to do, and never carries a token: it is answered to the client
and written to the audit log as it is.
"""

from __future__ import annotations

from llmgw.core.errors import LlmgwError


class SsoRefused(LlmgwError):
    """A login (or a refresh) refused; ``code`` is e.g. ``sso_bad_signature``, ``sso_wrong_issuer``."""

    def __init__(self, code: str, message: str, *, user: str = "", status: int = 401) -> None:
        super().__init__(message)
        self.code, self.message, self.user, self.status = code, message, user, status


class SsoUnavailable(LlmgwError):
    """The provider did not answer (discovery, keys, token endpoint): a 503, not the user's fault."""
