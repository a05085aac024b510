"""Who is calling the REST API, and what they may do: principals, credentials, passwords and the middleware.

``Auth`` (``credentials``) turns a bearer token or session cookie into a ``Principal``
(``principals``); ``middleware`` asks it for every REST request and refuses, in the API's
one error shape, what the principal's role does not reach (``principals.required``). Inside
projects the handlers ask ``projectaccess`` (a project's owner, members and viewers).
"""

from llmgw.control.auth.credentials import Auth

__all__ = ["Auth"]
