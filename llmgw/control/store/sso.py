"""The store's single sign-on part: flows begun and not finished (taken once), and each SSO user's link.

In the store, not in a process's memory: control planes sharing one PostgreSQL database (HA) finish a login
another began (a standby forwards the REST API to the leader, and a new leader takes over what the old one
had begun). Every write goes through the fenced transaction, as every other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from llmgw.control.store.base import StoreBase
from llmgw.control.store.tables import (
    ApiTokenRow,
    ProjectMemberRow,
    ProjectRow,
    SsoLinkRow,
    SsoPendingRow,
    UserRow,
)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredSsoLink:
    """An SSO user's link to the provider: its subject and sealed refresh token (``control.sso.seal``)."""

    user: str
    subject: str
    refresh_token: str = dataclasses.field(repr=False)
    groups: tuple[str, ...]
    created_at: float
    refreshed_at: float


class SsoNameTaken(ValueError):
    """An SSO login's user name is a local user's, or another provider account's."""


def _link(r: SsoLinkRow) -> StoredSsoLink:
    return StoredSsoLink(r.user, r.subject, r.refresh_token or "", tuple(r.groups or ()), r.created_at,
                         r.refreshed_at)


class SsoStore(StoreBase):
    """Pending flows and SSO users' links."""

    def put_sso_pending(self, pending_id: str, *, kind: str, data: Mapping[str, Any], expires_at: float) -> None:
        with self._tx() as s:
            s.add(SsoPendingRow(id=pending_id, kind=kind, data=dict(data), expires_at=expires_at))

    def count_sso_pending(self, *, now: float) -> int:
        with self._session() as s:
            return int(s.scalar(sa.select(sa.func.count()).select_from(SsoPendingRow)
                                .where(SsoPendingRow.expires_at > now)) or 0)

    def get_sso_pending(self, pending_id: str, *, kind: str, now: float) -> dict[str, Any] | None:
        """A pending flow's data, left in place (a device flow is polled); None when unknown or expired."""
        with self._session() as s:
            r = s.get(SsoPendingRow, pending_id)
            return dict(r.data) if r is not None and r.kind == kind and r.expires_at > now else None

    def take_sso_pending(self, pending_id: str, *, kind: str, now: float) -> dict[str, Any] | None:
        """A pending flow's data, deleted in the same statement: of two requests with one state, one gets it.
        None when unknown, taken already, or expired."""
        with self._tx() as s:
            got = s.execute(sa.delete(SsoPendingRow).where(SsoPendingRow.id == pending_id, SsoPendingRow.kind == kind)
                            .returning(SsoPendingRow.data, SsoPendingRow.expires_at)).first()
        if got is None or got[1] <= now:
            return None
        return dict(got[0])

    def prune_sso_pending(self, *, now: float) -> int:
        with self._tx() as s:
            return int(s.execute(sa.delete(SsoPendingRow).where(SsoPendingRow.expires_at <= now)).rowcount)

    def sso_sign_in(self, *, user: str, role: str, projects: Mapping[str, str], subject: str, refresh_token: str,
                    groups: tuple[str, ...], now: float) -> list[str]:
        """Creates or updates an SSO user (its role, its project memberships: exactly ``projects``) and its link,
        in one transaction. SsoNameTaken when the name is a local user's or another subject's. Returns the mapped
        projects that do not exist (left out)."""
        missing: list[str] = []
        with self._tx() as s:
            row = s.get(UserRow, user)
            if row is not None and (row.source or "local") != "sso":
                raise SsoNameTaken(f"a local user named {user!r} exists")
            link = s.get(SsoLinkRow, user)
            if link is not None and link.subject != subject:
                raise SsoNameTaken(f"user {user!r} belongs to another provider account")
            if row is None:
                s.add(UserRow(name=user, role=role, password_hash="!sso", created_at=now, source="sso"))
                s.flush()
            else:
                row.role = role
            s.execute(sa.delete(ProjectMemberRow).where(ProjectMemberRow.user == user))
            for project, prole in sorted(projects.items()):
                if s.get(ProjectRow, project) is None:
                    missing.append(project)
                    continue
                s.add(ProjectMemberRow(project=project, user=user, role=prole))
            if link is None:
                s.add(SsoLinkRow(user=user, subject=subject, refresh_token=refresh_token, groups=list(groups),
                                 created_at=now, refreshed_at=now))
            else:
                link.refresh_token, link.groups, link.refreshed_at = refresh_token, list(groups), now
        return missing

    def get_sso_link(self, user: str) -> StoredSsoLink | None:
        with self._session() as s:
            r = s.get(SsoLinkRow, user)
            return None if r is None else _link(r)

    def list_sso_links(self) -> list[StoredSsoLink]:
        with self._session() as s:
            return [_link(r) for r in s.scalars(sa.select(SsoLinkRow).order_by(SsoLinkRow.user))]

    def sso_sign_out(self, user: str) -> int:
        """Ends an SSO user's access: every token and session of theirs, their link (a next login makes it
        again) and their project memberships; the user row stays (the audit log names it). How many tokens."""
        with self._tx() as s:
            n = int(s.execute(sa.delete(ApiTokenRow).where(ApiTokenRow.subject == user,
                                                           ApiTokenRow.kind.in_(("user", "session")))).rowcount)
            s.execute(sa.delete(SsoLinkRow).where(SsoLinkRow.user == user))
            s.execute(sa.delete(ProjectMemberRow).where(ProjectMemberRow.user == user))
            return n
