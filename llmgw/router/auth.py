"""Who is calling: the router's API keys, as the control plane's endpoints document lists them.

``Authenticator.from_doc(auth)`` builds an immutable lookup from key hash to
``KeyInfo`` out of the endpoints document's keys (``llmgw.api.routing.AuthDoc``,
which reads them); the watcher builds a new one with each table, as it does the
``RouteTable``. ``check`` answers a ``KeyInfo`` or the ``errors.ApiError`` to send:
401 without a key (or with an unknown one) while keys are required, 403 for a
model outside the key's scope. While no key exists nothing is required and every
request is the anonymous key, so a fresh cluster answers at once; because that
also means "open to anyone who can reach it", ``check_listen`` warns about a
non-loopback listen without keys.

``ListenGuard`` repeats that check on every table, so deleting the last key of a
router listening beyond loopback is warned about when it happens, not only at start.

This module is pure: no sockets, no aiohttp; the control plane is never imported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from llmgw.api import routing
from llmgw.core import queueclasses, quota
from llmgw.router import errors

log = logging.getLogger(__name__)

HOW_TO_GET_ONE = "Create one with `llmgw key create NAME` and send it as `Authorization: Bearer <key>`."


@dataclasses.dataclass(frozen=True, slots=True)
class KeyInfo:
    """A caller: the key's id and what it may do."""

    id: str
    models: frozenset[str] = frozenset()  # empty: every model
    rpm: int = 0  # 0: unlimited
    tpm: int = 0  # 0: unlimited
    priority: int = 0
    project: str = ""  # "": no key (none exist), which every model is open to
    user: str = ""
    #: The key's budgets beyond rpm/tpm (issue 26).
    limits: quota.Limits = quota.Limits()
    #: How its requests wait in a model's queue (issue 32): class, flow, weight; resolved once per table.
    #: Derived from the key's and its project's fields, so not compared.
    queue_as: queueclasses.QueueAs = dataclasses.field(default=queueclasses.QueueAs(), compare=False)

    def allows(self, *names: str) -> bool:
        """Whether the key may use a model known by any of ``names`` (its name, served name, aliases)."""
        return not self.models or any(n in self.models for n in names)


#: Every request while no key exists.
ANONYMOUS = KeyInfo(id="")


@dataclasses.dataclass(frozen=True, slots=True)
class Authenticator:
    required: bool = False
    by_hash: Mapping[str, KeyInfo] = dataclasses.field(default_factory=dict)
    #: The budgets of the projects that have any, by project name.
    projects: Mapping[str, quota.Limits] = dataclasses.field(default_factory=dict)
    #: The cluster's priority classes (issue 32), which ``X-Llmgw-Priority`` names one of.
    classes: queueclasses.Classes = queueclasses.Classes()

    @classmethod
    def from_doc(cls, doc: routing.AuthDoc | Any) -> Authenticator:
        """From the table's keys (``AuthDoc``, or its JSON: tolerant, a missing or malformed one is no keys)."""
        auth = routing.AuthDoc.from_doc(doc)
        classes = queueclasses.Classes(auth.priority_classes)
        queueing = {p.name: p for p in auth.projects}
        none = routing.ProjectEntry("")

        def queue_as(k: routing.KeyEntry) -> queueclasses.QueueAs:
            p = queueing.get(k.project, none)
            return classes.queue_as(key_id=k.id, project=k.project, key_class=k.priority_class, key_weight=k.weight,
                                    project_class=p.priority_class, project_weight=p.weight)

        by_hash = {k.sha256.lower(): KeyInfo(id=k.id, models=frozenset(k.models), rpm=k.rpm, tpm=k.tpm,
                                             priority=k.priority, project=k.project, user=k.user, limits=k.limits,
                                             queue_as=queue_as(k))
                   for k in auth.keys}
        # `required` as the control plane says it, even with no usable key: it says so while any key
        # exists, and with every key disabled that is everyone refused, which is what disabling means.
        # Following the usable keys instead opened the API to anyone the moment the last one was disabled.
        return cls(required=auth.required, by_hash=by_hash,
                   projects={p.name: p.limits for p in auth.projects if p.limits.any}, classes=classes)

    def identify(self, authorization: bytes | None) -> KeyInfo | errors.ApiError:
        """The caller behind an ``Authorization`` header, scope not yet checked."""
        if not self.required:
            return ANONYMOUS
        secret = _bearer(authorization)
        if not secret:
            return _unauthorized("This endpoint needs an API key and the request carried none. " + HOW_TO_GET_ONE)
        # A dict lookup on the secret's sha256, not a constant-time compare: what a
        # timing difference could leak is how much of a *hash* matched, and learning a
        # prefix of sha256(secret) tells nothing about a 32-byte random secret.
        key = self.by_hash.get(hashlib.sha256(secret.encode()).hexdigest())
        if key is None:
            return _unauthorized("The API key is not valid (unknown or deleted); `llmgw key list` shows the "
                                 "keys that exist. " + HOW_TO_GET_ONE)
        return key

    def check(self, authorization: bytes | None, model: str, *,
              names: Iterable[str] = ()) -> KeyInfo | errors.ApiError:
        """The caller, or the refusal to send; ``names`` are the model's other names (served name, aliases)."""
        key = self.identify(authorization)
        if isinstance(key, errors.ApiError) or key.allows(model, *names):
            return key
        return errors.ApiError(403, f"The API key {key.id} may not use the model {model!r}; it may use: "
                                    f"{', '.join(sorted(key.models))}.", type="permission_error",
                               code="model_not_allowed", param="model")

    def visible(self, key: KeyInfo, models: Iterable[Any]) -> list[Any]:
        """The ``ModelRoute``s (anything with ``name``, ``served_name``, ``aliases``) ``key`` may use.

        A model restricted to other projects is not among them: it is not even said to exist.
        """
        return [m for m in models if key.allows(m.name, m.served_name, *m.aliases)
                and (not key.project or m.open_to(key.project))]


def check_listen(host: str, auth_required: bool, *, allow_no_auth: bool) -> list[str]:
    """Warnings for serving the OpenAI API beyond this machine while anyone may call it."""
    if auth_required or allow_no_auth or is_loopback(host):
        return []
    return [f"The router listens on {host}, beyond this machine, and no API key exists, so anyone who can "
            f"reach it may use every model. {HOW_TO_GET_ONE} Keys are enforced from the first one on."]


class ListenGuard:
    """Warns when the table a router on ``host`` serves requires no key, each time it becomes so.

    Auth is off exactly while no key exists; that is only safe on a loopback listen.
    Checked on every table, not only at start: deleting the last key opens a router
    that listens beyond this machine, and the operator must hear of it then. Said
    once per change, not once per table (one arrives with every replica change).
    """

    def __init__(self, host: str, *, allow_no_auth: bool = False,
                 warn: Callable[[str], None] | None = None) -> None:
        self.host = host
        self._allow = allow_no_auth
        self._warn = warn or log.warning
        self._open: bool | None = None  # unknown until the first table
        #: Every warning given, for tests and the status page.
        self.warnings: list[str] = []

    def check(self, authenticator: Authenticator) -> None:
        now_open = not authenticator.required
        if now_open == self._open:
            return
        self._open = now_open
        for warning in check_listen(self.host, authenticator.required, allow_no_auth=self._allow):
            self.warnings.append(warning)
            self._warn(warning)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname other than localhost: it may resolve to anything


def _bearer(header: bytes | None) -> str:
    if not header:
        return ""
    try:
        text = header.decode("latin-1").strip()
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return ""
    scheme, _, token = text.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _unauthorized(message: str) -> errors.ApiError:
    return errors.ApiError(401, message, type="invalid_request_error", code="invalid_api_key")

