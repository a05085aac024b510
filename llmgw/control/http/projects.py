"""``/api/v1/projects``: projects made, listed, described and deleted, their members and their limits.

Any logged-in user reaches these paths (``principals.required``); what each may do is
``auth.projectaccess``'s: operators and admins everything, a project's owner its members, its
members and viewers reading it. Only operators and admins create or delete projects and set
limits, so a project's owner cannot raise its own budget. A project the caller may not see is
answered as one that does not exist.

Limits are a partial ``core.quota.Limits`` document: each kind given is set, 0 or null removes it,
the rest stay. A bad value is 422 naming the field, and nothing is changed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, Request

from llmgw.control.auth import principals
from llmgw.control.auth.middleware import PRINCIPAL, forbidden_message
from llmgw.control.auth.projectaccess import Access, limits_refusal
from llmgw.control.http import schemas
from llmgw.control.http.apierrors import ApiError, Conflict, NotFound, Unprocessable
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import ProjectRefused, StoredProject, UnknownProject
from llmgw.core import quota

_ACCESS = "llmgw.access"


async def access_of(request: Request, db: StoreThread) -> Access:
    """The caller and its project roles (a request that came past no auth middleware is insecure mode's)."""
    if (known := request.scope.get(_ACCESS)) is not None:
        return known  # type: ignore[no-any-return]
    p: principals.Principal = request.scope.get(PRINCIPAL) or principals.INSECURE
    if p.kind == "insecure" or p.role in (principals.OPERATOR, principals.ADMIN):
        access = Access(p)
    else:
        access = Access(p, await db.call(db.store.project_roles_of, p.name))
    request.scope[_ACCESS] = access
    return access


def gate(db: StoreThread) -> Callable[[Request], Awaitable[None]]:
    """A dependency of the keys' and projects' routes, run before the body is read: a change asked by a user
    who is neither an operator nor in any project is refused as the permission table refused it before
    projects existed (403 naming the role), whatever the body."""

    async def check(request: Request) -> None:
        if request.method in ("GET", "HEAD"):
            return
        access = await access_of(request, db)
        if not access.manager and not access.roles:
            p = access.principal
            message = forbidden_message(p, principals.Need(principals.OPERATOR), request.method, request.url.path)
            raise denied(f"{message}; or a project's owner can make them a member (`llmgw project add-member`)")

    return check


def denied(message: str) -> ApiError:
    return ApiError(403, message, code="forbidden", type_="permission_error")


def no_project(name: str) -> NotFound:
    return NotFound("project", name, "`llmgw project list` lists the projects you belong to")


def bad_limits(e: quota.BadLimits) -> Unprocessable:
    """422 naming the field (``limits.tokens_per_day``) as ``param``."""
    return Unprocessable(str(e), code="invalid_limits", param=str(e).split(":", 1)[0])


def limits_from(doc: dict[str, Any] | None, base: quota.Limits = quota.Limits()) -> quota.Limits:
    """``base`` with the partial ``doc`` applied (0 or null removes a kind); 422 naming the field when bad."""
    try:
        return base.merged({k: (None if v == 0 and not isinstance(v, bool) else v) for k, v in (doc or {}).items()})
    except quota.BadLimits as e:
        raise bad_limits(e) from None
    except TypeError as e:  # a value of a type no limit takes, past the checks (a list...)
        raise Unprocessable(f"limits: {e}", code="invalid_limits", param="limits") from None


def printable(value: Any) -> Any:
    """Text (or a list of it) without control characters or lone surrogates, which no store or log can encode
    (found by the REST fuzz, tests/integration/test_rest_fuzz.py, as a 500)."""
    for text in [value] if isinstance(value, str) else value or ():
        if any(0xD800 <= ord(c) <= 0xDFFF or ord(c) < 0x20 for c in text):
            raise ValueError("must be printable text (no control characters or lone surrogates)")
    return value


class ProjectCreate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = pydantic.Field(max_length=63)
    description: str = pydantic.Field(default="", max_length=500)
    limits: dict[str, Any] = pydantic.Field(default_factory=dict, description="A partial core.quota.Limits document")

    _printable = pydantic.field_validator("name", "description")(printable)


class MemberPut(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    user: str = pydantic.Field(min_length=1, max_length=63)
    role: str = pydantic.Field(description="owner, member or viewer")

    _printable = pydantic.field_validator("user", "role")(printable)


class Member(schemas.Body):
    user: str
    role: str


class Project(schemas.Body):
    name: str
    description: str
    limits: dict[str, schemas.Number] = pydantic.Field(description="The limits in force; {}: none")
    created_at: schemas.Number
    created_by: str
    members: list[Member]
    keys: int = pydantic.Field(description="How many API keys the project has")
    role: str = pydantic.Field(description="The caller's role in the project; '' when none (an operator)")


class ProjectList(schemas.Body):
    items: list[Project]


def project_doc(p: StoredProject, access: Access) -> dict[str, Any]:
    return {"name": p.name, "description": p.description, "limits": p.limits.to_doc(), "created_at": p.created_at,
            "created_by": p.created_by, "members": [{"user": u, "role": r} for u, r in p.members], "keys": p.keys,
            "role": access.roles.get(p.name, "")}


def router(db: StoreThread, cluster: Any) -> APIRouter:
    """``cluster`` is kicked after a change of limits, so routers get them in the next table."""
    r = APIRouter(dependencies=[Depends(gate(db))])

    async def visible(request: Request, name: str) -> tuple[Access, StoredProject]:
        access = await access_of(request, db)
        found = await db.call(db.store.get_project, name)
        if found is None or not access.sees_project(name):
            raise no_project(name)
        return access, found

    def need_manager(access: Access) -> None:
        if not access.manager:
            raise denied(f"{access.principal.describe()}; creating and deleting projects and setting limits needs "
                         "a cluster operator or admin")

    @r.post("/api/v1/projects", status_code=201, response_model=Project)
    async def create_project(body: ProjectCreate, request: Request) -> dict[str, Any]:
        """Creates a project (operators and admins); its limits may be given at once."""
        access = await access_of(request, db)
        need_manager(access)
        try:
            quota.check_project_name(body.name)
        except quota.BadLimits as e:
            raise Unprocessable(str(e), code="invalid_name", param="name") from None
        limits = limits_from(body.limits)  # checked before anything is written
        try:
            made = await db.call(db.store.create_project, body.name, description=body.description,
                                 created_by=access.principal.actor, now=time.time())
        except ProjectRefused as e:
            raise Conflict(str(e), code="project_exists", param=e.field) from None
        if limits.any:
            made = await db.call(db.store.set_project_limits, body.name, limits)
            cluster.kick()
        return project_doc(made, access)

    @r.get("/api/v1/projects", response_model=ProjectList)
    async def list_projects(request: Request) -> dict[str, Any]:
        """Every project for operators and admins; the caller's own for other users."""
        access = await access_of(request, db)
        found = await db.call(db.store.list_projects)
        return {"items": [project_doc(p, access) for p in found if access.sees_project(p.name)]}

    @r.get("/api/v1/projects/{name}", response_model=Project)
    async def describe_project(name: str, request: Request) -> dict[str, Any]:
        """A project's members, limits and key count."""
        access, found = await visible(request, name)
        return project_doc(found, access)

    @r.delete("/api/v1/projects/{name}", response_model=schemas.Deleted)
    async def delete_project(name: str, request: Request) -> dict[str, Any]:
        """Deletes a project with no keys left (``default`` never)."""
        access, _ = await visible(request, name)
        need_manager(access)
        try:
            if not await db.call(db.store.delete_project, name):
                raise no_project(name)
        except ProjectRefused as e:
            raise Conflict(str(e), code="project_in_use", param=e.field) from None
        cluster.kick()
        return {"deleted": name}

    @r.put("/api/v1/projects/{name}/members", response_model=Project)
    async def put_member(name: str, body: MemberPut, request: Request) -> dict[str, Any]:
        """Adds a member or changes their role (the project's owner, operators, admins)."""
        access, _ = await visible(request, name)
        if not access.manages_project(name):
            raise denied(access.why_not("adding a member", name))
        try:
            return project_doc(await db.call(db.store.put_member, name, body.user, body.role), access)
        except ProjectRefused as e:
            raise Unprocessable(str(e), code=f"invalid_{e.field}", param=e.field) from None
        except UnknownProject:
            raise no_project(name) from None

    @r.delete("/api/v1/projects/{name}/members/{user}", response_model=schemas.Deleted)
    async def remove_member(name: str, user: str, request: Request) -> dict[str, Any]:
        access, _ = await visible(request, name)
        if not access.manages_project(name):
            raise denied(access.why_not("removing a member", name))
        if not await db.call(db.store.remove_member, name, user):
            raise NotFound("member", user, f"`llmgw project describe {name}` lists the project's members")
        return {"deleted": user}

    @r.put("/api/v1/projects/{name}/limits", response_model=Project)
    async def set_limits(name: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        """Sets some of a project's limits (operators and admins): each kind given is set, 0 or null removes it."""
        access, found = await visible(request, name)
        if not access.manager:
            raise denied(limits_refusal(access.principal))
        limits = limits_from(body, found.limits)
        changed = await db.call(db.store.set_project_limits, name, limits)
        cluster.kick()
        return project_doc(changed, access)

    return r
