"""Who may do what inside projects (issue 26): the fine checks the handlers make after the gate.

``principals.required`` lets any logged-in user reach ``/api/v1/projects*`` and ``/api/v1/keys*``; what
they may do there depends on their role in each project, which only the store knows, so the handlers
ask ``Access``, built from the principal and ``Store.project_roles_of``:

- a cluster operator or admin (and ``--insecure``): everything, and only they set limits (a project
  owner cannot raise its own budget) and create or delete projects;
- a project's owner: reads it, manages its members and every key in it;
- a member: reads it, and creates, lists and deletes its own keys there (``user`` is itself);
- a viewer of the project: reads it (its members, limits and key count), and its own keys if any.

A project a user does not belong to is answered 404, as one that does not exist: its name is not
revealed to someone who may not see it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from llmgw.control.auth import principals
from llmgw.control.auth.principals import Principal

OWNER, MEMBER, VIEWER = "owner", "member", "viewer"


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """A principal and its role in each project it belongs to (project → role)."""

    principal: Principal
    roles: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def manager(self) -> bool:
        """A cluster operator or admin, or insecure mode: every project, every key, limits."""
        p = self.principal
        return p.kind == "insecure" or p.role in (principals.OPERATOR, principals.ADMIN)

    @property
    def user(self) -> str:
        return self.principal.name

    def sees_project(self, project: str) -> bool:
        return self.manager or project in self.roles

    def manages_project(self, project: str) -> bool:
        """Its members and every key in it."""
        return self.manager or self.roles.get(project) == OWNER

    def sees_key(self, project: str, user: str) -> bool:
        return self.manages_project(project) or (project in self.roles and bool(user) and user == self.user)

    def makes_key(self, project: str, user: str) -> bool:
        """A key in ``project`` for ``user``: an owner's for anyone, a member's for itself only."""
        return self.manages_project(project) or (self.roles.get(project) == MEMBER and bool(user)
                                                 and user == self.user)

    def changes_key(self, project: str, user: str) -> bool:
        """Deletes, disables or enables a key (its limits are the manager's alone)."""
        return self.makes_key(project, user)

    def why_not(self, action: str, project: str) -> str:
        """The sentence of a refusal: who, what they are in the project, and who may do it."""
        role = self.roles.get(project)
        a = "an" if role == OWNER else "a"
        said = f"user {self.user} is {f'{a} {role}' if role else 'not a member'} of project {project!r}"
        return (f"{said}; {action} needs the project's owner (a member may do it for its own keys) or a cluster "
                "operator; an owner can change roles with "
                f"`llmgw project add-member {project} {self.user} --role owner`")


def limits_refusal(p: Principal) -> str:
    return (f"{p.describe()}; limits are set by a cluster operator or admin only (a project owner cannot raise "
            "its own budget); ask one to run `llmgw project set-limits` / `llmgw key update`")
