"""The store's projects (issue 26): teams sharing the fleet, their members' roles and their budgets.

A project owns API keys (``api_keys.project``); ``default`` holds every key made without one (and
every key made before projects existed, moved there by migration 0014) and cannot be deleted. A
project that still has keys is not deleted either: its keys would be left pointing at nothing, so
the refusal says to delete or move them first.
"""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from llmgw.control.store import queueing
from llmgw.control.store.base import StoreBase
from llmgw.control.store.tables import ApiKeyRow, ProjectMemberRow, ProjectRow, UserRow
from llmgw.core import quota
from llmgw.core.errors import LlmgwError


class UnknownProject(LlmgwError, LookupError):
    """No project of that name; the message says how to list or make one."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"project {name!r} not found; `llmgw project list` lists them, "
                         f"`llmgw project create {name}` makes it")


class ProjectRefused(LlmgwError, ValueError):
    """A project change that cannot be made as asked (exists already, still has keys, unknown user...)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredProject:
    name: str
    description: str = ""
    limits: quota.Limits = quota.Limits()
    created_at: float = 0.0
    created_by: str = ""
    #: (user, role) pairs, by user.
    members: tuple[tuple[str, str], ...] = ()
    #: How many API keys the project has.
    keys: int = 0

    def role_of(self, user: str) -> str:
        """The user's role in the project; "" when not a member."""
        return dict(self.members).get(user, "")


class ProjectStore(StoreBase):
    """Projects, their members and their limits."""

    def _project(self, s: sa.orm.Session, row: ProjectRow) -> StoredProject:
        members = s.execute(sa.select(ProjectMemberRow.user, ProjectMemberRow.role)
                            .where(ProjectMemberRow.project == row.name).order_by(ProjectMemberRow.user))
        keys = s.scalar(sa.select(sa.func.count()).select_from(ApiKeyRow).where(ApiKeyRow.project == row.name))
        return StoredProject(row.name, row.description or "", quota.Limits.from_doc(row.limits or {}),
                             row.created_at, row.created_by or "", tuple((u, r) for u, r in members), int(keys or 0))

    def create_project(self, name: str, *, description: str = "", created_by: str = "", now: float) -> StoredProject:
        quota.check_project_name(name)
        with self._tx() as s:
            if s.get(ProjectRow, name) is not None:
                raise ProjectRefused("name", f"project {name!r} exists already; `llmgw project describe {name}` "
                                             "shows it")
            row = ProjectRow(name=name, description=description, limits={}, created_at=now, created_by=created_by)
            s.add(row)
            s.flush()
            return self._project(s, row)

    def list_projects(self) -> list[StoredProject]:
        with self._session() as s:
            return [self._project(s, r) for r in s.scalars(sa.select(ProjectRow).order_by(ProjectRow.name))]

    def get_project(self, name: str) -> StoredProject | None:
        with self._session() as s:
            row = s.get(ProjectRow, name)
            return None if row is None else self._project(s, row)

    def delete_project(self, name: str) -> bool:
        """Deletes a project and its memberships; False when there is none. ``default`` and a project with keys
        are refused (ProjectRefused)."""
        if name == quota.DEFAULT_PROJECT:
            raise ProjectRefused("name", "project 'default' holds the keys made without a project and cannot be "
                                         "deleted")
        with self._tx() as s:
            row = s.get(ProjectRow, name)
            if row is None:
                return False
            keys = s.scalar(sa.select(sa.func.count()).select_from(ApiKeyRow).where(ApiKeyRow.project == name))
            if keys:
                raise ProjectRefused("name", f"project {name!r} still has {keys} key(s); delete them "
                                             f"(`llmgw key list --project {name}`, `llmgw key delete ID`) or move "
                                             "them to another project first")
            s.execute(sa.delete(ProjectMemberRow).where(ProjectMemberRow.project == name))
            s.delete(row)
            queueing.forget(s, "projects", name)  # one made again under the name starts without its class
            return True

    def put_member(self, project: str, user: str, role: str) -> StoredProject:
        """Adds a member or changes their role; UnknownProject, or ProjectRefused for a bad role or user."""
        if role not in quota.PROJECT_ROLES:
            raise ProjectRefused("role", f"role {role!r}: expected one of {', '.join(quota.PROJECT_ROLES)}")
        with self._tx() as s:
            row = s.get(ProjectRow, project)
            if row is None:
                raise UnknownProject(project)
            if s.get(UserRow, user) is None:
                raise ProjectRefused("user", f"user {user!r} not found; `llmgw user list` lists them")
            member = s.get(ProjectMemberRow, (project, user))
            if member is None:
                s.add(ProjectMemberRow(project=project, user=user, role=role))
            else:
                member.role = role
            s.flush()
            return self._project(s, row)

    def remove_member(self, project: str, user: str) -> bool:
        """False when the user was not a member; UnknownProject when there is no such project."""
        with self._tx() as s:
            if s.get(ProjectRow, project) is None:
                raise UnknownProject(project)
            return bool(s.execute(sa.delete(ProjectMemberRow).where(ProjectMemberRow.project == project,
                                                                    ProjectMemberRow.user == user)).rowcount)

    def set_project_limits(self, name: str, limits: quota.Limits) -> StoredProject:
        with self._tx() as s:
            row = s.get(ProjectRow, name)
            if row is None:
                raise UnknownProject(name)
            row.limits = limits.to_doc()
            s.flush()
            return self._project(s, row)

    def project_roles_of(self, user: str) -> dict[str, str]:
        """The user's role in each project they belong to: project → role."""
        with self._session() as s:
            rows = s.execute(sa.select(ProjectMemberRow.project, ProjectMemberRow.role)
                             .where(ProjectMemberRow.user == user))
            return {p: r for p, r in rows}

    def project_limits(self) -> dict[str, quota.Limits]:
        """The projects that have limits (the routers' table carries them): name → limits."""
        with self._session() as s:
            return {r.name: quota.Limits.from_doc(r.limits) for r in s.scalars(sa.select(ProjectRow)) if r.limits}
