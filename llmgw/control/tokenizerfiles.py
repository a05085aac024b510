"""A ``kv_aware`` model's tokenizer files, read by the control plane for its routers (``router.tokenizers``).

Three files, named here and nowhere else (no name from a request ever reaches a URL): ``tokenizer.json``
(required), ``tokenizer_config.json`` and ``chat_template.jinja`` (optional), beside the model's weights
in its source, read as the deploy preview reads metadata (``remotemeta``: the cluster's hub or mirror,
its network guard and trust; the hub's token to the hub only):

* ``hf://ORG/REPO[@REVISION][/FOLDER]``: ``{hub}/ORG/REPO/resolve/{REVISION or main}/[FOLDER/]FILE``;
* ``mirror://NAME[/PATH]``: ``{mirror}/files/NAME[/PATH]/FILE``.

A ``file://`` or ``pkg:`` source is on the nodes, not here, and a single ``.gguf`` carries no tokenizer
files: such a model offers none (``version_of`` is ""), and its routers fall back for text requests.
The version a table names is the source's text: pin a revision (``@COMMIT``) for files that never move
under a router. Answers are kept per source (a failure for ``RETRY_S``); reads run in a worker thread,
at most one per source at a time, each file at most ``MAX_FILE_BYTES``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.parse
from collections.abc import Callable

import httpx

from llmgw.control import remotemeta
from llmgw.control.placement.needs import fetched_source
from llmgw.control.store.offloop import StoreThread
from llmgw.core import netpolicy, sources, specs

FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
REQUIRED = "tokenizer.json"
#: The most one file may weigh (Gemma 3's tokenizer.json, among the largest, is 33 MB).
MAX_FILE_BYTES = 48 << 20
#: A failed read is tried again after this long.
RETRY_S = 60.0


class NoTokenizer(Exception):
    """The model offers no tokenizer files; the message says why and what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class Files:
    version: str
    tokenizer_json: bytes
    tokenizer_config: bytes | None
    chat_template: str | None

    def to_doc(self) -> dict[str, str | None]:
        """The answer of ``GET /api/v1/router/tokenizer/{model}`` (``router.tokenizers.TokenizerFiles`` reads it)."""
        return {"version": self.version, "tokenizer_json": self.tokenizer_json.decode("utf-8", "replace"),
                "tokenizer_config": (self.tokenizer_config.decode("utf-8", "replace")
                                     if self.tokenizer_config is not None else None),
                "chat_template": self.chat_template}


def version_of(spec: specs.ModelSpec) -> str:
    """What a table names as the model's tokenizer version: its source's text, for a ``kv_aware`` model whose
    files the control plane can read; "" otherwise (nothing fetched, nothing to pay)."""
    if spec.routing != "kv_aware":
        return ""
    src = fetched_source(spec)
    if src is None or src.kind not in ("hf", "mirror") or src.subpath.endswith(".gguf"):
        return ""
    return src.text


class TokenizerFiles:
    """Reads and keeps the files per source; one per control plane, beside ``remotemeta.Reader``."""

    def __init__(self, reader: remotemeta.Reader, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.reader, self._clock = reader, clock
        self._known: dict[str, Files | tuple[str, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def for_model(self, db: StoreThread, name: str) -> Files:
        """The files of the stored model ``name``; ``NoTokenizer`` naming why there are none."""
        stored = await db.get_model(name)
        if stored is None:
            raise NoTokenizer(f"model {name!r} does not exist; `llmgw get models` lists them")
        return await self.files(name, stored.model.spec)

    async def files(self, name: str, spec: specs.ModelSpec) -> Files:
        """The files of ``spec``'s source; ``NoTokenizer`` naming why there are none."""
        version = version_of(spec)
        if not version:
            raise NoTokenizer(f"model {name!r} offers no tokenizer to routers: only a kv_aware model whose "
                              "spec.source is hf:// or mirror:// (a folder, not a .gguf) does")
        lock = self._locks.setdefault(version, asyncio.Lock())
        async with lock:
            known = self._known.get(version)
            if isinstance(known, tuple) and self._clock() - known[1] >= RETRY_S:
                known = None
            if known is None:
                try:
                    known = await asyncio.to_thread(self._read, sources.parse(version))
                except NoTokenizer as exc:
                    known = (str(exc), self._clock())
                self._known[version] = known
        if isinstance(known, tuple):
            raise NoTokenizer(known[0])
        return known

    def _read(self, src: sources.Source) -> Files:
        if src.kind == "hf":
            base = (f"{self.reader.hub_endpoint}/{src.repo}/resolve/"
                    f"{urllib.parse.quote(src.revision or 'main', safe='')}/")
            headers = self.reader.auth_headers()
        else:
            if not self.reader.mirror_url:
                raise NoTokenizer(f"{src.text} names the cluster's mirror, and no --mirror-url is set on the "
                                  "control plane")
            base, headers = f"{self.reader.mirror_url}/files/{urllib.parse.quote(src.name)}/", {}
        folder = src.subpath.strip("/")
        base += urllib.parse.quote(folder) + "/" if folder else ""
        got: dict[str, bytes | None] = {}
        try:
            with self.reader.client() as http:
                for name in FILES:
                    got[name] = _get(http, base + name, headers)
        except (httpx.HTTPError, netpolicy.Refused) as exc:
            raise NoTokenizer(f"cannot read the tokenizer files of {src.text}: {type(exc).__name__}: {exc}") from None
        tokenizer_json = got[REQUIRED]
        if tokenizer_json is None:
            raise NoTokenizer(f"{src.text} has no {REQUIRED}: its routers cannot tokenize text for kv_aware")
        template = got["chat_template.jinja"]
        try:
            return Files(src.text, tokenizer_json, got["tokenizer_config.json"],
                         template.decode("utf-8") if template is not None else None)
        except UnicodeDecodeError as exc:
            raise NoTokenizer(f"{src.text}'s chat_template.jinja is not UTF-8 ({exc})") from None


def _get(http: httpx.Client, url: str, headers: dict[str, str]) -> bytes | None:
    """The file's bytes; None when the server says it has none (404); ``NoTokenizer`` past ``MAX_FILE_BYTES``."""
    with http.stream("GET", url, headers=headers) as resp:
        if resp.status_code == 404:
            return None
        if resp.status_code >= 400:
            raise NoTokenizer(f"GET {url}: HTTP {resp.status_code}")
        out = bytearray()
        for chunk in resp.iter_bytes():
            out += chunk
            if len(out) > MAX_FILE_BYTES:
                raise NoTokenizer(f"GET {url}: more than {MAX_FILE_BYTES} bytes, past what a router takes")
        return bytes(out)
