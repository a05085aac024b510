"""``llmgw settings get|set``: the cluster's spec policy over ``/api/v1/settings`` (changing it is an admin's).

``set KEY VALUE`` replaces a key; for the list ``allowed_env``, ``allowed_env+=NAME`` adds names and
``allowed_env-=NAME`` removes them (read, changed, written back: an admin's occasional command, where the
last writer wins). Values: ``allow_remote_code true|false``; ``allowed_env A,B`` (``""`` for none);
``priority_classes premium,interactive,batch`` (highest first, issue 32).
"""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.console import Console

from llmgw.cli import client as client_mod
from llmgw.core.errors import LlmgwError

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True, highlight=False)
PATH = "/api/v1/settings"
KEYS = ("allowed_env", "allow_remote_code", "sso_required", "sso_break_glass", "priority_classes")
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def change(current: dict[str, Any], key: str, value: str | None) -> dict[str, Any]:
    """The PUT body for ``set KEY VALUE`` (or ``set KEY+=NAMES`` / ``KEY-=NAMES`` with value None).

    LlmgwError saying the usage for anything else.
    """
    op = "="
    if value is None:
        for sign in ("+=", "-="):
            if sign in key:
                key, value = key.split(sign, 1)
                op = sign
                break
        else:
            raise LlmgwError(f"give KEY VALUE (`llmgw settings set allow_remote_code true`) or "
                             f"allowed_env+=NAME; got {key!r} alone")
    if key not in KEYS:
        raise LlmgwError(f"unknown setting {key!r}; the settings are: {', '.join(KEYS)}")
    if key in ("allow_remote_code", "sso_required"):
        if op != "=" or value.lower() not in _TRUE + _FALSE:
            raise LlmgwError(f"{key} is true or false, got {value!r}")
        return {key: value.lower() in _TRUE}
    if key == "sso_break_glass":
        if op != "=" or not value:
            raise LlmgwError("sso_break_glass is the name of the one local user who may log in with a password "
                             "when sso_required is on, e.g. admin")
        return {key: value}
    if key == "priority_classes":
        if op != "=":
            raise LlmgwError("priority_classes is replaced whole, highest first: "
                             "`llmgw settings set priority_classes premium,interactive,batch`")
        return {key: _names(value)}
    names = _names(value)
    have = list(current.get("allowed_env") or [])
    if op == "+=":
        return {key: have + [n for n in names if n not in have]}
    if op == "-=":
        return {key: [n for n in have if n not in names]}
    return {key: names}


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", markup=True)
    return typer.Exit(1)


def _show(doc: dict[str, Any]) -> None:
    console.print(f"allowed_env: {', '.join(doc['allowed_env']) or '(none beyond each engine’s own knobs)'}",
                  markup=False)
    console.print(f"allow_remote_code: {'true' if doc['allow_remote_code'] else 'false'}", markup=False)
    if "sso_required" in doc:
        console.print(f"sso_required: {'true' if doc['sso_required'] else 'false'} (break-glass local user: "
                      f"{doc.get('sso_break_glass', 'admin')})", markup=False)
    if "priority_classes" in doc:
        console.print(f"priority_classes: {', '.join(doc['priority_classes'])} (highest first)", markup=False)


def register(app: typer.Typer) -> None:
    """Adds ``settings get|set`` to ``app``."""
    settings_app = typer.Typer(no_args_is_help=True, help="The cluster's spec policy: extra env names a model "
                                                          "may set, and whether code-loading engine flags are allowed.")
    app.add_typer(settings_app, name="settings")
    url_opt = typer.Option(None, "--url", help=f"Control plane URL [env LLMGW_URL, default {client_mod.DEFAULT_URL}]")

    @settings_app.command("get")
    def get(output: str = typer.Option("table", "-o", "--output", help="table or json"),
            url: str = url_opt) -> None:
        """The settings in force (anyone logged in may read them)."""
        try:
            doc = client_mod.Client(url or client_mod.default_url()).get(PATH)
        except LlmgwError as e:
            raise _fail(str(e)) from None
        if output == "json":
            console.print_json(json.dumps(doc))
        else:
            _show(doc)

    @settings_app.command("set")
    def set_(key: str = typer.Argument(..., help="allowed_env, allowed_env+=NAME, allowed_env-=NAME or "
                                                 "allow_remote_code"),
             value: str = typer.Argument(None, help="the value: true/false, or NAME,NAME"),
             url: str = url_opt) -> None:
        """Change one setting (an admin's; audited as `settings set`)."""
        client = client_mod.Client(url or client_mod.default_url())
        try:
            current = client.get(PATH) if ("+=" in key or "-=" in key) else {}
            _, doc = client.request("PUT", PATH, json=change(current, key, value))
        except LlmgwError as e:
            raise _fail(str(e)) from None
        said = ", ".join(doc.get("changed") or []) or "nothing (already so)"
        console.print(f"changed: {said}", markup=False)
        _show(doc)
