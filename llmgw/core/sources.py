"""What a model's ``spec.source`` names, parsed once into a ``Source`` every part of llmgw agrees on.

Five kinds of source:

* ``file:///abs/path`` (or ``/abs/path``): a file or directory already on the node;
* ``pkg:NAME``: the .gguf carried by an installed Python distribution;
* ``hf://ORG/REPO[@REVISION][/SUBPATH]``: a Hugging Face repository, through the cluster's HF-compatible
  endpoint (its mirror, or the hub itself);
* ``https://host/path/file`` (``http://`` too, for a server inside the cluster): one file;
* ``mirror://NAME[/PATH]``: content the cluster's mirror holds under ``files/NAME``.

``Source.cache_name()`` is the one name a remote source's weights take in an agent's weights cache. It is
made here, from the source text alone, so the agent that fetches, the control plane that places and the
garbage collector that removes all agree on it without asking each other; and it is safe by construction
(one path element, ``[A-Za-z0-9._-]``, never starting with a dot) so it can never climb out of the cache.
Every refusal says what to write instead. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import re
import urllib.parse

from llmgw.core import errors

KINDS = ("file", "pkg", "hf", "http", "mirror")
REMOTE_KINDS = frozenset({"hf", "http", "mirror"})
MAX_CACHE_NAME = 120
_HASH_CHARS = 12
_WRITE = ("write one of file:///abs/path, pkg:NAME, hf://ORG/REPO[@REVISION][/FILE], https://host/path/file "
          "or mirror://NAME[/PATH]")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SLUG_BAD = re.compile(r"[^A-Za-z0-9._-]+")


class SourceError(errors.SpecError, ValueError):
    """``spec.source`` names nothing llmgw can fetch or find; the message says what to write instead."""

    def __init__(self, reason: str) -> None:
        super().__init__("spec.source", reason)


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    kind: str            # "file" | "pkg" | "hf" | "http" (http:// or https://) | "mirror"
    text: str            # the canonical source string; cache_name() is derived from it alone
    path: str = ""       # file: absolute path; pkg: distribution name
    url: str = ""        # http: the URL
    repo: str = ""       # hf: "org/name"
    revision: str = ""   # hf: "" means main
    subpath: str = ""    # hf: one file (a .gguf) or a folder inside the repo; mirror: path inside the name
    name: str = ""       # mirror: the mirror's top-level name

    @property
    def remote(self) -> bool:
        """True when the weights must be fetched into the cache (hf, http, mirror)."""
        return self.kind in REMOTE_KINDS

    def cache_name(self) -> str:
        """One safe name in the weights cache for this source: a readable slug and a short sha256 of the text.

        The hash keeps two sources with the same slug apart (``@main`` and ``@v2``, two hosts); the slug is
        only for the person reading ``llmgw get weights``.
        """
        digest = hashlib.sha256(self.text.encode()).hexdigest()[:_HASH_CHARS]
        if self.kind == "hf":
            readable = "-".join(p for p in (self.repo, self.revision, self.subpath) if p)
        elif self.kind == "http":
            parts = urllib.parse.urlsplit(self.url)
            readable = f"{parts.hostname or ''}-{parts.path.rsplit('/', 1)[-1]}"
        elif self.kind == "mirror":
            readable = "-".join(p for p in (self.name, self.subpath) if p)
        else:
            readable = self.path
        slug = _SLUG_BAD.sub("-", f"{self.kind}-{readable}").strip("-._")
        slug = slug[:MAX_CACHE_NAME - _HASH_CHARS - 1].rstrip("-._")
        return f"{slug}-{digest}"


def with_file(source: Source, file: str) -> Source:
    """The hf source that names ``file`` inside ``source`` (its folder, if it names one): spec.source_file folded in.

    Folding it into the source gives the single file its own cache name, so two models that take two
    different .gguf files of one repo never share (or remove) each other's weights.
    """
    if source.kind != "hf":
        raise SourceError(f"spec.source_file is for hf:// sources only; {source.text!r} already names one thing")
    sub = _subpath(file, "spec.source_file")
    joined = f"{source.subpath}/{sub}" if source.subpath else sub
    rev = f"@{source.revision}" if source.revision else ""
    return parse(f"hf://{source.repo}{rev}/{joined}")


def parse(text: str) -> Source:
    """The ``Source`` that ``text`` names; SourceError, saying what to write, for anything else."""
    text = text.strip()
    if not text:
        raise SourceError(f"the source is empty; {_WRITE}")
    if text.startswith("/"):
        text = "file://" + text
    if text.startswith("file:"):
        return _file(text)
    if text.startswith("pkg:"):
        name = text[4:].strip()
        if not _NAME.fullmatch(name):
            raise SourceError(f"{text!r} names no installable package; write pkg:DISTRIBUTION-NAME")
        return Source(kind="pkg", text=f"pkg:{name}", path=name)
    if text.startswith("hf://"):
        return _hf(text)
    if text.startswith(("https://", "http://")):
        return _http(text)
    if text.startswith("mirror://"):
        return _mirror(text)
    if text.startswith("hf:") or text.startswith("huggingface"):
        raise SourceError(f"unsupported source {text!r}; a Hugging Face repository is written hf://ORG/REPO")
    raise SourceError(f"unsupported source {text!r}; {_WRITE}")


def _file(text: str) -> Source:
    parsed = urllib.parse.urlsplit(text)
    if parsed.netloc not in ("", "localhost"):
        raise SourceError(f"{text!r} names host {parsed.netloc!r}; a file source is a path on the node, "
                          "written file:///absolute/path (fetch from another host with https://)")
    path = urllib.parse.unquote(parsed.path)
    if not path.startswith("/"):
        raise SourceError(f"a file source must be an absolute path, got {text!r}; write file:///absolute/path")
    refuse_system_path(path)
    return Source(kind="file", text=f"file://{path}", path=path)


#: Kernel and device filesystems: no weights live there, and reading them leaks the host (``/proc/self/environ``).
SYSTEM_DIRS = ("/proc", "/sys", "/dev")


def refuse_system_path(path: str) -> None:
    """SourceError for a file source under /proc, /sys or /dev (``..`` folded first), at apply.

    Only the obvious: the authoritative check is the node's, which knows its source roots and follows
    symlinks (``llmgw.agent.sourcepaths``); this one spares the operator a round trip for what no node allows.
    """
    folded = posixpath.normpath("/" + path.lstrip("/"))
    for d in SYSTEM_DIRS:
        if folded == d or folded.startswith(d + "/"):
            raise SourceError(f"{path} is under {d}, where no weights are kept; a file source names weights under "
                              "a node's source roots (its weights directories, or source_roots in the agent's "
                              "settings)")


def _hf(text: str) -> Source:
    rest = text[len("hf://"):]
    parts = rest.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise SourceError(f"{text!r} names no repository; write hf://ORG/REPO[@REVISION][/FILE] "
                          "(a repository without an org is written with its current org, e.g. openai-community/gpt2)")
    org, repo_rev = parts[0], parts[1]
    repo, _, revision = repo_rev.partition("@")
    for label, value in (("org", org), ("repository", repo)):
        if not _NAME.fullmatch(value) or value in (".", ".."):
            raise SourceError(f"{text!r}: {label} {value!r} is not a Hugging Face name (letters, digits, '.', "
                              "'_' and '-'); write hf://ORG/REPO[@REVISION][/FILE]")
    if "@" in repo_rev and not _NAME.fullmatch(revision):
        raise SourceError(f"{text!r}: revision {revision!r} is not a branch, tag or commit name; write "
                          "hf://ORG/REPO@REVISION with a revision of letters, digits, '.', '_' and '-'")
    rest_path = "/".join(parts[2:])
    subpath = _subpath(rest_path, text) if rest_path.strip("/") else ""
    rev = f"@{revision}" if revision else ""
    canonical = f"hf://{org}/{repo}{rev}" + (f"/{subpath}" if subpath else "")
    return Source(kind="hf", text=canonical, repo=f"{org}/{repo}", revision=revision, subpath=subpath)


def _http(text: str) -> Source:
    parsed = urllib.parse.urlsplit(text)
    if not parsed.hostname:
        raise SourceError(f"{text!r} names no host; write https://host/path/file")
    if parsed.username or parsed.password:
        raise SourceError(f"{text!r} carries credentials in the URL, where every log and `llmgw get` would "
                          "show them; serve the file without them, or put it on the cluster's mirror")
    if parsed.fragment:
        raise SourceError(f"{text!r} has a #fragment, which no server sees; remove it")
    if not parsed.path or parsed.path.endswith("/"):
        raise SourceError(f"{text!r} names no file; an http source is one file, written https://host/path/file "
                          "(for a directory, put it on the cluster's mirror and write mirror://NAME)")
    return Source(kind="http", text=text, url=text)


def _mirror(text: str) -> Source:
    rest = text[len("mirror://"):]
    name, _, sub = rest.partition("/")
    if not _NAME.fullmatch(name):
        raise SourceError(f"{text!r}: {name!r} is not a mirror name (letters, digits, '.', '_' and '-', not "
                          "starting with '.'); write mirror://NAME[/PATH]")
    subpath = _subpath(sub, text) if sub.strip("/") else ""
    canonical = f"mirror://{name}" + (f"/{subpath}" if subpath else "")
    return Source(kind="mirror", text=canonical, name=name, subpath=subpath)


def _subpath(sub: str, text: str) -> str:
    """A relative path inside a repository or mirror name: no '..', '.', empty or hidden-control parts."""
    parts = sub.strip("/").split("/")
    for p in parts:
        if p in ("", ".", "..") or "\\" in p or any(ord(c) < 32 for c in p):
            raise SourceError(f"{text!r}: path {sub!r} has a {p!r} part; name a path inside the repository "
                              "with plain '/'-separated names (no '..', '.', '//' or backslashes)")
    return "/".join(parts)
