"""Named contexts, as kubectl has them: a cluster (its control planes' URLs) and a user with its token.

The CLI kept one saved login per URL, so logging in as a second user replaced the first, and a
cluster of several control planes needed a login for each (issue 24). A context is a name for
"this cluster as this user": ``llmgw login --context NAME [--url URL ...]`` makes one,
``llmgw context use|list|delete`` manages them, ``--context NAME`` (anywhere on any command line) or
``LLMGW_CONTEXT`` picks one, and the current context is used otherwise. A request goes to the
context's URLs in order, the next when one does not answer (``client.Client``).

The file is ``$XDG_CONFIG_HOME/llmgw/credentials.json`` as before, 0600 in a 0700 directory, replaced
whole on each write (a new file made with O_EXCL, then renamed over the old one: a crash mid-write never
leaves half a file, and a file or link planted at the temporary name is refused rather than written
through). A file of the old shape (``{URL: {"token", "user"}}``) is read as one context per URL, named
by its host and port, and written in the new shape at the first change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer

from llmgw.cli import output
from llmgw.core.errors import LlmgwError

VERSION = 2
DEFAULT_URL = "http://127.0.0.1:8080"
CONTEXT_ENV = "LLMGW_CONTEXT"
FLAG = "--context"


@dataclasses.dataclass
class Context:
    name: str
    #: The cluster: its control planes' URLs, tried in this order.
    urls: list[str]
    user: str = ""
    #: "" once logged out: the context (its URLs) stays, its credential does not.
    token: str = ""
    #: The CA (PEM) ``llmgw login`` pinned for an https:// cluster (``trust``); "": the system's authorities.
    ca: str = ""


@dataclasses.dataclass
class Credentials:
    contexts: dict[str, Context] = dataclasses.field(default_factory=dict)
    #: The context used when none is named ("": none).
    current: str = ""


def path_of(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "llmgw" / "credentials.json"


def normal(url: str) -> str:
    return url.strip().rstrip("/")


def name_for(url: str) -> str:
    """The name a context gets when none is given: the URL's host and port (``127.0.0.1:8080``)."""
    parts = urlsplit(normal(url))
    return parts.netloc or normal(url)


def split_urls(values: list[str]) -> list[str]:
    """``--url`` values (repeatable, or comma-separated) as distinct normalised URLs; LlmgwError for a non-URL."""
    urls: list[str] = []
    for value in values:
        for raw in value.split(","):
            url = normal(raw)
            if not url:
                continue
            if not url.startswith(("http://", "https://")) or not urlsplit(url).netloc:
                raise LlmgwError(f"--url {raw.strip()!r}: expected a control plane's http(s)://HOST:PORT")
            if url not in urls:
                urls.append(url)
    return urls


def _context(name: str, raw: object) -> Context | None:
    if not isinstance(raw, dict):
        return None
    urls = [normal(u) for u in raw.get("urls", []) if isinstance(u, str) and u.strip()]
    user, token, ca = raw.get("user", ""), raw.get("token", ""), raw.get("ca", "")
    return Context(name, urls, user if isinstance(user, str) else "", token if isinstance(token, str) else "",
                   ca if isinstance(ca, str) else "")


def read(path: Path | None = None) -> Credentials:
    """The saved contexts; an old file (one login per URL) read as one context per URL."""
    path = path or path_of()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return Credentials()
    except (OSError, ValueError) as e:
        raise LlmgwError(f"cannot read {path}: {e}; move it aside and run `llmgw login` again") from None
    if not isinstance(doc, dict):
        return Credentials()
    if doc.get("version") == VERSION:
        found = {name: c for name, raw in (doc.get("contexts") or {}).items()
                 if isinstance(name, str) and (c := _context(name, raw)) is not None}
        current = doc.get("current_context")
        return Credentials(found, current if isinstance(current, str) and current in found else "")
    return _migrated(doc)


def _migrated(doc: dict[str, Any]) -> Credentials:
    """The old shape, ``{URL: {"token": ..., "user": ...}}``: each URL its own context, named by host:port."""
    creds = Credentials()
    for url, entry in sorted(doc.items()):
        if not isinstance(url, str) or not isinstance(entry, dict) or not isinstance(entry.get("token"), str):
            continue
        name, n = name_for(url), 2
        while name in creds.contexts:
            name, n = f"{name_for(url)}-{n}", n + 1
        user = entry.get("user")
        creds.contexts[name] = Context(name, [normal(url)], user if isinstance(user, str) else "", entry["token"])
    # The default URL's login was the one used without --url.
    by_default = [c.name for c in creds.contexts.values() if c.urls == [normal(DEFAULT_URL)]]
    if by_default:
        creds.current = by_default[0]
    return creds


def write(creds: Credentials, path: Path | None = None) -> Path:
    """Replaces the file whole with ``creds``; 0600 in a 0700 directory."""
    path = path or path_of()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    doc = {"version": VERSION, "current_context": creds.current,
           "contexts": {c.name: {"urls": c.urls, "user": c.user, "token": c.token, **({"ca": c.ca} if c.ca else {})}
                        for c in sorted(creds.contexts.values(), key=lambda c: c.name)}}
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def unknown(name: str, creds: Credentials) -> LlmgwError:
    have = ", ".join(sorted(creds.contexts)) or "none yet"
    return LlmgwError(f"there is no context {name!r} (from --context or {CONTEXT_ENV}; saved: {have}): "
                      f"`llmgw login --context {name} --url URL` makes it, `llmgw context list` lists them")


def named(creds: Credentials, env: Mapping[str, str] | None = None) -> Context | None:
    """The context named by ``--context``/``LLMGW_CONTEXT``; None when none is named; LlmgwError when unknown."""
    env = os.environ if env is None else env
    name = env.get(CONTEXT_ENV, "").strip()
    if not name:
        return None
    if name not in creds.contexts:
        raise unknown(name, creds)
    return creds.contexts[name]


def selected(creds: Credentials, env: Mapping[str, str] | None = None) -> Context | None:
    """The context named by ``--context``/``LLMGW_CONTEXT``, else the current one, else None."""
    return named(creds, env) or creds.contexts.get(creds.current)


def for_url(creds: Credentials, url: str, env: Mapping[str, str] | None = None) -> Context | None:
    """The context a request to ``url`` uses: the named one whatever its URLs, else the current one when
    it lists ``url``, else the one named for ``url``, else the first (by name) that lists it."""
    chosen = named(creds, env)
    if chosen is not None:
        return chosen
    url = normal(url)
    current = creds.contexts.get(creds.current)
    if current is not None and url in current.urls:
        return current
    own = creds.contexts.get(name_for(url))
    if own is not None and url in own.urls:
        return own
    return next((c for _, c in sorted(creds.contexts.items()) if url in c.urls), None)


def take_flag(argv: list[str], env: MutableMapping[str, str]) -> list[str]:
    """``argv`` without ``--context NAME``/``--context=NAME`` (anywhere before ``--``), which goes to ``env``.

    So that every command takes it where kubectl users put it, after the verb too, without each of the
    CLI's forty commands declaring it; ``llmgw login`` reads it back from the environment.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            out += argv[i:]
            break
        if arg == FLAG and i + 1 < len(argv):
            env[CONTEXT_ENV] = argv[i + 1]
            i += 2
            continue
        if arg.startswith(FLAG + "="):
            env[CONTEXT_ENV] = arg.split("=", 1)[1]
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


def rows(creds: Credentials) -> list[tuple[str, str, str, str]]:
    """``context list``'s rows: CURRENT (``*``), NAME, USER (``-`` when logged out), URLS."""
    return [("*" if c.name == creds.current else "", c.name, c.user if c.token else "-", ",".join(c.urls))
            for c in sorted(creds.contexts.values(), key=lambda c: c.name)]


def register(app: typer.Typer) -> None:
    """Adds ``context use|list|delete`` to ``app``, and ``--context`` before any command (for ``--help``; ``main``
    takes it from anywhere on the line)."""
    ctx_app = typer.Typer(no_args_is_help=True, help="Saved logins by name (a cluster's URLs and a user): list them, "
                          "pick the current one, delete one. `llmgw login --context NAME` makes one.")
    app.add_typer(ctx_app, name="context")

    def fail(message: str) -> typer.Exit:
        typer.echo(f"error: {message}", err=True)
        return typer.Exit(1)

    @ctx_app.command("list")
    def list_() -> None:
        """The saved contexts; * marks the current one (LLMGW_CONTEXT or --context picks another per command)."""
        try:
            creds = read()
        except LlmgwError as e:
            raise fail(str(e)) from None
        listed = rows(creds)
        for line in output.render(("CURRENT", "NAME", "USER", "URLS"), listed):
            typer.echo(line)
        if not listed:
            typer.echo("(none saved: `llmgw login --context NAME --url URL` makes one)")

    @ctx_app.command("use")
    def use(name: str = typer.Argument(..., help="The context every command uses from now on")) -> None:
        """Make NAME the current context."""
        try:
            creds = read()
            if name not in creds.contexts:
                raise unknown(name, creds)
            creds.current = name
            write(creds)
        except LlmgwError as e:
            raise fail(str(e)) from None
        c = creds.contexts[name]
        typer.echo(f"current context: {name} ({c.user if c.token else 'logged out'} at {', '.join(c.urls)})")

    @ctx_app.command("delete")
    def delete(name: str = typer.Argument(..., help="The context to forget")) -> None:
        """Forget context NAME here (its token stays valid on the server until it expires: `llmgw logout
        --context NAME` first ends it there)."""
        try:
            creds = read()
            if name not in creds.contexts:
                raise unknown(name, creds)
            gone = creds.contexts.pop(name)
            was_current = creds.current == name
            if was_current:
                creds.current = ""
            write(creds)
        except LlmgwError as e:
            raise fail(str(e)) from None
        note = " (it was the current context: none is current now; `llmgw context use NAME`)" if was_current else ""
        still = "; its token stays valid on the server until it expires" if gone.token else ""
        typer.echo(f"context {name} deleted{still}{note}")

    @app.callback()
    def _root(context: str = typer.Option(None, FLAG, envvar=CONTEXT_ENV, help="The context (`llmgw context list`) "
                                          "this command uses, given anywhere on the line [default: the current "
                                          "one]")) -> None:
        if context:
            os.environ[CONTEXT_ENV] = context
