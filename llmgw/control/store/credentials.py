"""The store's credentials: API keys, bootstrap tokens, users and REST tokens (hashes, never secrets)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import sqlalchemy as sa

from llmgw.control.store import queueing
from llmgw.control.store.base import StoreBase
from llmgw.control.store.projects import UnknownProject
from llmgw.control.store.tables import (
    ApiKeyRow,
    ApiTokenRow,
    ProjectMemberRow,
    ProjectRow,
    SsoLinkRow,
    TokenRow,
    UserRow,
)
from llmgw.core import quota
from llmgw.core.errors import LlmgwError


class KeyIdTaken(LlmgwError, ValueError):
    """A new API key's id is another key's already (``Store.add_key``); the caller draws another."""


@dataclasses.dataclass(frozen=True, slots=True)
class StoredKey:
    """An API key as stored: its hash, never its secret."""

    id: str
    name: str
    sha256: str
    models: tuple[str, ...] = ()  # empty: every model
    rpm: int = 0  # 0: unlimited
    tpm: int = 0  # 0: unlimited
    priority: int = 0
    created_at: float = 0.0
    disabled: bool = False
    last_used_at: float = 0.0  # 0: never used
    project: str = quota.DEFAULT_PROJECT
    user: str = ""  # the user the key was made for; "": the project's, no one's in particular
    limits: quota.Limits = quota.Limits()


@dataclasses.dataclass(frozen=True, slots=True)
class StoredToken:
    """A bootstrap token as stored: its id and the hash of its secret, never the secret."""

    id: str
    sha256: str
    node_name: str  # empty: the node id the agent asks for
    expires_at: float
    uses_left: int
    created_at: float


@dataclasses.dataclass(frozen=True, slots=True)
class StoredUser:
    """A user as stored: an argon2 hash, never the password."""

    name: str
    role: str
    password_hash: str
    created_at: float
    #: "local" (a password) or "sso" (made by single sign-on, no password: ``control.sso``).
    source: str = "local"


def _user(r: UserRow) -> StoredUser:
    return StoredUser(r.name, r.role, r.password_hash, r.created_at, r.source or "local")


@dataclasses.dataclass(frozen=True, slots=True)
class StoredApiToken:
    """A REST credential as stored: its id and the hash of its secret, never the secret."""

    id: str
    sha256: str
    kind: str  # user, session or router
    subject: str  # the user's name or the router's
    created_at: float
    expires_at: float = 0.0  # 0: until deleted
    last_used_at: float = 0.0
    label: str = ""


def _key_from_row(row: ApiKeyRow) -> StoredKey:
    return StoredKey(id=row.id, name=row.name, sha256=row.sha256, models=tuple(row.models or ()), rpm=row.rpm,
                     tpm=row.tpm, priority=row.priority, created_at=row.created_at, disabled=row.disabled,
                     last_used_at=row.last_used_at or 0.0, project=row.project or quota.DEFAULT_PROJECT,
                     user=row.user or "", limits=quota.Limits.from_doc(row.limits or {}))


def _api_token(r: ApiTokenRow) -> StoredApiToken:
    return StoredApiToken(r.id, r.sha256, r.kind, r.subject, r.created_at, r.expires_at, r.last_used_at, r.label)


class CredentialStore(StoreBase):
    """API keys (the router's), bootstrap tokens (a node's join), users and their REST tokens."""

    # -- API keys ----------------------------------------------------------------
    def add_key(self, key: StoredKey) -> StoredKey:
        """Stores a new key; KeyIdTaken when another key has its id (the caller draws another id),
        UnknownProject when its project does not exist."""
        try:
            with self._tx() as s:
                if s.get(ProjectRow, key.project) is None:
                    raise UnknownProject(key.project)
                s.add(ApiKeyRow(id=key.id, name=key.name, sha256=key.sha256, models=list(key.models), rpm=key.rpm,
                                tpm=key.tpm, priority=key.priority, created_at=key.created_at,
                                disabled=key.disabled, project=key.project, user=key.user,
                                limits=key.limits.to_doc()))
        except sa.exc.IntegrityError:
            with self._session() as s:
                if s.get(ApiKeyRow, key.id) is None:
                    raise
            raise KeyIdTaken(f"key id {key.id} is taken") from None
        return key

    def list_keys(self) -> list[StoredKey]:
        with self._session() as s:
            rows = s.scalars(sa.select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id))
            return [_key_from_row(r) for r in rows]

    def get_key(self, key_id: str) -> StoredKey | None:
        with self._session() as s:
            row = s.get(ApiKeyRow, key_id)
            return None if row is None else _key_from_row(row)

    def update_key(self, key_id: str, *, models: tuple[str, ...] | None = None, rpm: int | None = None,
                   tpm: int | None = None, limits: quota.Limits | None = None) -> StoredKey | None:
        """Changes what is given (None: unchanged); the key as it is now, or None when no such key exists."""
        with self._tx() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return None
            if models is not None:
                row.models = list(models)
            if rpm is not None:
                row.rpm = rpm
            if tpm is not None:
                row.tpm = tpm
            if limits is not None:
                row.limits = limits.to_doc()
            return _key_from_row(row)

    def delete_key(self, key_id: str) -> bool:
        with self._tx() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return False
            s.delete(row)
            queueing.forget(s, "keys", key_id)
            return True

    def set_key_disabled(self, key_id: str, disabled: bool) -> StoredKey | None:
        """Disables or enables a key; the key as it is now, or None when no such key exists."""
        with self._tx() as s:
            row = s.get(ApiKeyRow, key_id)
            if row is None:
                return None
            row.disabled = disabled
            return _key_from_row(row)

    def touch_keys(self, used: Mapping[str, float]) -> None:
        """Records when keys were last used; a time older than the one stored changes nothing, so reports
        from several routers, arriving in any order, leave the newest."""
        with self._tx() as s:
            for key_id, at in used.items():
                row = s.get(ApiKeyRow, key_id)
                if row is not None and at > (row.last_used_at or 0.0):
                    row.last_used_at = at

    # -- bootstrap tokens and users (llmgw init, llmgw token create) --------------------
    def add_token(self, token: StoredToken) -> None:
        with self._tx() as s:
            s.add(TokenRow(id=token.id, sha256=token.sha256, node_name=token.node_name,
                           expires_at=token.expires_at, uses_left=token.uses_left, created_at=token.created_at))

    def get_token(self, token_id: str) -> StoredToken | None:
        with self._session() as s:
            r = s.get(TokenRow, token_id)
            return None if r is None else StoredToken(r.id, r.sha256, r.node_name, r.expires_at, r.uses_left,
                                                      r.created_at)

    def spend_token(self, token_id: str, *, now: float) -> bool:
        """Takes one use of a token that is unexpired and has one left; False when it had none.

        One conditional UPDATE, so two joins racing for a token's last use cannot both get it.
        """
        with self._tx() as s:
            done = s.execute(sa.update(TokenRow).where(TokenRow.id == token_id, TokenRow.uses_left > 0,
                                                       TokenRow.expires_at > now)
                             .values(uses_left=TokenRow.uses_left - 1))
            return bool(done.rowcount)

    def put_user(self, user: StoredUser) -> None:
        """Creates or replaces a user (its role and password hash)."""
        with self._tx() as s:
            row = s.get(UserRow, user.name)
            if row is None:
                s.add(UserRow(name=user.name, role=user.role, password_hash=user.password_hash,
                              created_at=user.created_at, source=user.source))
            else:
                row.role, row.password_hash, row.source = user.role, user.password_hash, user.source

    def get_user(self, name: str) -> StoredUser | None:
        with self._session() as s:
            r = s.get(UserRow, name)
            return None if r is None else _user(r)

    def list_users(self) -> list[StoredUser]:
        with self._session() as s:
            return [_user(r) for r in s.scalars(sa.select(UserRow).order_by(UserRow.name))]

    def delete_user(self, name: str) -> bool:
        """Deletes a user and every token and session of theirs, in one transaction."""
        with self._tx() as s:
            row = s.get(UserRow, name)
            if row is None:
                return False
            s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.subject == name,
                                                   ApiTokenRow.kind.in_(("user", "session"))))
            s.execute(sa.delete(ProjectMemberRow).where(ProjectMemberRow.user == name))
            s.execute(sa.delete(SsoLinkRow).where(SsoLinkRow.user == name))  # a refresh must not make it again
            s.delete(row)
            return True

    # -- REST credentials (control.auth) -------------------------------------------------
    def add_api_token(self, token: StoredApiToken) -> None:
        with self._tx() as s:
            s.add(ApiTokenRow(id=token.id, sha256=token.sha256, kind=token.kind, subject=token.subject,
                              label=token.label, created_at=token.created_at, expires_at=token.expires_at,
                              last_used_at=token.last_used_at))

    def get_api_token(self, token_id: str) -> StoredApiToken | None:
        with self._session() as s:
            r = s.get(ApiTokenRow, token_id)
            return None if r is None else _api_token(r)

    def list_api_tokens(self, *, kind: str | None = None, subject: str | None = None) -> list[StoredApiToken]:
        q = sa.select(ApiTokenRow).order_by(ApiTokenRow.created_at, ApiTokenRow.id)
        if kind is not None:
            q = q.where(ApiTokenRow.kind == kind)
        if subject is not None:
            q = q.where(ApiTokenRow.subject == subject)
        with self._session() as s:
            return [_api_token(r) for r in s.scalars(q)]

    def delete_api_token(self, token_id: str) -> bool:
        with self._tx() as s:
            return bool(s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.id == token_id)).rowcount)

    def delete_api_tokens(self, *, subject: str, kinds: Iterable[str]) -> int:
        """Deletes a subject's tokens of these kinds (a user's sessions at logout, a router's at removal)."""
        with self._tx() as s:
            return int(s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.subject == subject,
                                                              ApiTokenRow.kind.in_(tuple(kinds)))).rowcount)

    def touch_api_token(self, token_id: str, *, at: float) -> None:
        # Unfenced: a usage stamp that a standby authenticating a router's poll may make too.
        with self._session.begin() as s:
            s.execute(sa.update(ApiTokenRow).where(ApiTokenRow.id == token_id).values(last_used_at=at))
