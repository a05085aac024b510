"""``llmgw project create|list|describe|delete|add-member|remove-member|set-limits`` over ``/api/v1/projects``.

A project groups API keys and the users who share them (owner, member, viewer); operators and admins
create projects and set their limits, a project's owner manages its members and keys. A cluster made
before projects has every key in ``default``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.cli import output as out
from llmgw.cli import priorityflags
from llmgw.cli.limitflags import limits_cell, with_limit_flags
from llmgw.core import quota, units
from llmgw.core.errors import LlmgwError

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", markup=True)
    return typer.Exit(1)


def _call(url: str | None, method: str, path: str, body: Any = None) -> Any:
    c = client_mod.Client(url or client_mod.default_url())
    try:
        return c.request(method, path, json=body)[1]
    except LlmgwError as e:
        raise _fail(str(e)) from None
    finally:
        c.close()


PROJECTS = out.Listing("project", (
    out.Column("PROJECT", lambda p: p["name"]),
    out.Column("DESCRIPTION", lambda p: p["description"] or "-"),
    out.Column("MEMBERS", lambda p: str(len(p["members"]))),
    out.Column("KEYS", lambda p: str(p["keys"])),
    out.Column("LIMITS", lambda p: limits_cell(p["limits"])),
    out.Column("YOUR ROLE", lambda p: p.get("role") or "-"),
), name=lambda p: str(p["name"]))


def describe_text(p: dict[str, Any], keys: list[dict[str, Any]], *, now: float | None = None) -> str:
    now = time.time() if now is None else now
    lines = [f"Name:         {p['name']}", f"Description:  {p['description'] or '-'}",
             f"Created:      {units.format_ago(float(p['created_at'] or 0), now=now)} by {p['created_by'] or '-'}",
             "Limits:"]
    lines += [f"  {k}: {p['limits'][k]}" for k in quota.KINDS if p["limits"].get(k)] or ["  none"]
    lines.append("Members:")
    lines += [f"  {m['user']} ({m['role']})" for m in p["members"]] or ["  none"]
    lines.append(f"Keys ({p['keys']}):")
    lines += [f"  {k['id']}  {k['name']}  user={k['user'] or '-'}  limits={limits_cell(k['limits'])}"
              for k in keys] or ["  none you may see"]
    lines.append(f"Usage:        llmgw usage --project {p['name']}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Adds ``project ...`` to ``app``."""
    project_app = typer.Typer(no_args_is_help=True, help="Projects: teams sharing the fleet, their keys and budgets.")
    app.add_typer(project_app, name="project")
    app.add_typer(project_app, name="projects", hidden=True)
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")

    @project_app.command("create")
    def create(name: str = typer.Argument(..., help="1-63 lowercase letters, digits and '-'"),
               description: str = typer.Option("", "--description", help="What the project is"),
               priority_class: str | None = priorityflags.class_option(),
               weight: float | None = priorityflags.weight_option(),
               url: str = url_opt) -> None:
        """Create a project (operators and admins)."""
        _call(url, "POST", "/api/v1/projects", {"name": name, "description": description})
        console.print(f"project/{name} created")
        if priorityflags.body(priority_class, weight):
            set_priority(name, priority_class, weight, url)

    @project_app.command("set-priority")
    def set_priority(name: str = typer.Argument(...), priority_class: str | None = priorityflags.class_option(),
                     weight: float | None = priorityflags.weight_option(), url: str = url_opt) -> None:
        """Set a project's priority class and weight (operators and admins); its keys take them unless they have
        their own."""
        if not (queueing := priorityflags.body(priority_class, weight)):
            raise _fail("give --priority-class, --weight or both")
        doc = _call(url, "PUT", f"/api/v1/projects/{name}/priority", queueing)
        console.print(f"project/{name}: {priorityflags.said(doc)}")

    @project_app.command("list")
    def list_(output: out.Format = typer.Option(out.Format.table, "-o", "--output",
                                                help="table, wide, json, yaml or name"),
              url: str = url_opt) -> None:
        """List the projects you may see (operators and admins: all); `llmgw get projects` sorts and watches too."""
        items = _call(url, "GET", "/api/v1/projects")["items"]
        try:
            out.show(items, PROJECTS, out.View(output=output))
        except LlmgwError as e:
            raise _fail(str(e)) from None

    @project_app.command("describe")
    def describe(name: str = typer.Argument(...),
                 output: str = typer.Option("text", "-o", "--output", help="text or json"),
                 url: str = url_opt) -> None:
        """A project's members, limits and keys."""
        p = _call(url, "GET", f"/api/v1/projects/{name}")
        keys = _call(url, "GET", f"/api/v1/keys?project={name}")["items"]
        if output == "json":
            console.print_json(json.dumps({**p, "key_list": keys}))
        else:
            console.print(describe_text(p, keys), markup=False, highlight=False)

    @project_app.command("delete")
    def delete(name: str = typer.Argument(...), url: str = url_opt) -> None:
        """Delete a project that has no keys left (`default` cannot be deleted)."""
        _call(url, "DELETE", f"/api/v1/projects/{name}")
        console.print(f"project/{name} deleted")

    @project_app.command("add-member")
    def add_member(name: str = typer.Argument(...), user: str = typer.Argument(...),
                   role: str = typer.Option("member", "--role", help="owner, member or viewer"),
                   url: str = url_opt) -> None:
        """Add a user to a project, or change their role there (its owner, operators, admins)."""
        _call(url, "PUT", f"/api/v1/projects/{name}/members", {"user": user, "role": role})
        console.print(f"project/{name}: {user} is {role}")

    @project_app.command("remove-member")
    def remove_member(name: str = typer.Argument(...), user: str = typer.Argument(...), url: str = url_opt) -> None:
        """Remove a user from a project."""
        _call(url, "DELETE", f"/api/v1/projects/{name}/members/{user}")
        console.print(f"project/{name}: {user} removed")

    @project_app.command("set-limits")
    @with_limit_flags
    def set_limits(name: str = typer.Argument(...), url: str = url_opt, *, limits: dict[str, Any]) -> None:
        """Set a project's budgets (operators and admins); 0 removes one, a flag not given leaves it."""
        if not limits:
            raise _fail("give at least one limit, e.g. --tokens-per-day 1000000 (0 removes one)")
        p = _call(url, "PUT", f"/api/v1/projects/{name}/limits", limits)
        console.print(f"project/{name} limits: {limits_cell(p['limits'])}")
