"""Single sign-on's configuration: the provider, the client, and the mapping from groups to roles and projects.

Resolved from ``llmgw server``'s ``--sso-*`` flags (``serving.config``): the client secret is read from a file
that only its owner may read (an argv or a group-readable file would show it), and the mapping comes from
``--sso-role-map GROUP=ROLE`` / ``--sso-project-map GROUP=PROJECT:ROLE`` (repeatable) and/or
``--sso-mapping-file`` (YAML or JSON: ``{"roles": {GROUP: ROLE}, "projects": {GROUP: {PROJECT: ROLE}}}``).
A user's cluster role is the strongest role any of their groups maps to; their project memberships are the
union of their groups' (the stronger role where two give the same project).
"""

from __future__ import annotations

import dataclasses
import json
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from llmgw.control.auth import principals
from llmgw.core import quota
from llmgw.core.errors import LlmgwError

DEFAULT_SCOPES = ("openid", "profile", "email", "groups", "offline_access")
_PROJECT_RANK = {r: i for i, r in enumerate(quota.PROJECT_ROLES)}
_ROLE_RANK = {r: i for i, r in enumerate(principals.USER_ROLES)}


@dataclasses.dataclass(frozen=True, slots=True)
class GroupMapping:
    """Groups to a cluster role and to project memberships."""

    roles: Mapping[str, str] = dataclasses.field(default_factory=dict)
    projects: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)

    def role_of(self, groups: Iterable[str]) -> str:
        """The strongest cluster role the groups map to; "" for none."""
        found = [self.roles[g] for g in groups if g in self.roles]
        return max(found, key=_ROLE_RANK.__getitem__) if found else ""

    def projects_of(self, groups: Iterable[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for g in groups:
            for project, role in self.projects.get(g, {}).items():
                if project not in out or _PROJECT_RANK[role] > _PROJECT_RANK[out[project]]:
                    out[project] = role
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class SsoConfig:
    """What the server needs to sign users in through an OpenID Connect provider."""

    issuer: str
    client_id: str
    client_secret: str = dataclasses.field(repr=False)
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    groups_claim: str = "groups"
    #: The claim a user's llmgw name comes from (``sub`` when the token lacks it).
    username_claim: str = "preferred_username"
    mapping: GroupMapping = dataclasses.field(default_factory=GroupMapping)
    #: How often each SSO user's refresh token is used: a removed group or an ended provider session
    #: ends the user's llmgw tokens within this plus one refresh pass.
    refresh_interval_s: float = 300.0
    #: Seconds of clock difference allowed on exp/iat/nbf.
    leeway_s: float = 60.0
    #: How long a begun login (state, nonce, PKCE verifier) may wait for its end.
    pending_ttl_s: float = 600.0


def read_secret(path: Path) -> str:
    """The client secret from ``path``, refused when group or others may read it; LlmgwError says what to do."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as e:
        raise LlmgwError(f"cannot read --sso-client-secret-file {path}: {e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LlmgwError(f"--sso-client-secret-file {path} may be read by its group or others (mode "
                         f"{stat.S_IMODE(mode):04o}): the client secret lets anyone sign in as this cluster; "
                         f"`chmod 600 {path}`")
    if not text:
        raise LlmgwError(f"--sso-client-secret-file {path} is empty: put the client secret the identity provider "
                         "gave llmgw's client registration in it")
    return text


def _role(value: str, where: str) -> str:
    if value not in principals.USER_ROLES:
        raise LlmgwError(f"{where}: role {value!r} is not one of {', '.join(principals.USER_ROLES)}")
    return value


def _project_role(value: str, where: str) -> str:
    if value not in quota.PROJECT_ROLES:
        raise LlmgwError(f"{where}: project role {value!r} is not one of {', '.join(quota.PROJECT_ROLES)}")
    return value


def mapping_of(role_flags: Iterable[str], project_flags: Iterable[str], mapping_file: Path | None) -> GroupMapping:
    """The mapping from the flags and the file (the flags win on a group both name); LlmgwError naming the bad
    entry and its flag."""
    roles: dict[str, str] = {}
    projects: dict[str, dict[str, str]] = {}
    if mapping_file is not None:
        try:
            doc = yaml.safe_load(mapping_file.read_text()) if mapping_file.suffix in (".yaml", ".yml") \
                else json.loads(mapping_file.read_text())
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise LlmgwError(f"cannot read --sso-mapping-file {mapping_file}: {e}") from None
        if not isinstance(doc, dict) or set(doc) - {"roles", "projects"}:
            raise LlmgwError(f"--sso-mapping-file {mapping_file}: expected {{\"roles\": {{GROUP: ROLE}}, "
                             "\"projects\": {GROUP: {PROJECT: ROLE}}}")
        where = f"--sso-mapping-file {mapping_file}"
        for g, r in (doc.get("roles") or {}).items():
            roles[str(g)] = _role(str(r), f"{where}, roles.{g}")
        for g, ps in (doc.get("projects") or {}).items():
            if not isinstance(ps, dict):
                raise LlmgwError(f"{where}, projects.{g}: expected {{PROJECT: ROLE}}")
            projects[str(g)] = {str(p): _project_role(str(r), f"{where}, projects.{g}.{p}") for p, r in ps.items()}
    for flag in role_flags:
        group, sep, role = flag.rpartition("=")
        if not sep or not group:
            raise LlmgwError(f"--sso-role-map {flag!r}: expected GROUP=ROLE, e.g. llmgw-admins=admin")
        roles[group] = _role(role, f"--sso-role-map {flag!r}")
    for flag in project_flags:
        group, sep, rest = flag.rpartition("=")
        project, sep2, prole = rest.partition(":")
        if not sep or not group or not project:
            raise LlmgwError(f"--sso-project-map {flag!r}: expected GROUP=PROJECT[:ROLE], e.g. team-a=team-a:member")
        projects.setdefault(group, {})[project] = _project_role(prole if sep2 else "member",
                                                                f"--sso-project-map {flag!r}")
    return GroupMapping(roles=roles, projects=projects)
