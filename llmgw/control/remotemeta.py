"""The metadata of remote weights, read before a replica is placed: the one owner of those HTTP reads.

A model whose ``source`` is remote (hf://, http(s)://, mirror://) has no file on
any node until a node fetches it, yet placement needs its size (disk, and the
memory estimate) and its shape (heads, layers: the estimate and the engine
check) before it picks that node. So the control plane reads the metadata
alone: an hf repo's file list with sizes and its ``config.json`` and
safetensors headers, or a GGUF header, each through Range requests of a few
kilobytes, from the cluster's mirror or hub endpoint, never the files. A source's
own URL is read only where ``netguard`` allows: never loopback, link-local or this
host's addresses, unless ``--fetch-allow-private`` names them.

The reads run in a worker thread, started from the loop when a pass sees a
remote source not read yet (``want``); a pass only reads ``known()``, a copy of
the answers, so a slow or unreachable hub never holds a pass. A source that
cannot be read (offline, 404, not a model) is answered too, with the problem:
the pass then places the replica without an estimate and says why, rather than
waiting for it forever. A failed read is tried again after ``retry_s``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import certifi
import httpx

from llmgw.control import netguard
from llmgw.control.placement import needs
from llmgw.control.placement.needs import RemoteWeights
from llmgw.core import modelfacts, netpolicy, sources, weightmeta
from llmgw.core.inventory import WeightFile
from llmgw.core.specs import ModelSpec

log = logging.getLogger(__name__)

#: A GGUF header is read in growing Range requests: most fit the first (a 2 MB
#: vocabulary is common), a 150,000-token one needs the second or third.
_GGUF_FIRST, _GGUF_MAX = 1 << 20, 1 << 26
#: The files of an hf repo an engine needs (the fetcher's list, ``contract12``).
_TOKENIZER_SUFFIXES = (".json", ".model", ".txt", ".tiktoken")
#: Past this many safetensors files only the first's header is read (for the dtype): the
#: size comes from the listing, so a 100-file model costs a few requests, not two hundred.
_HEADERS_READ = 16



class Unreadable(Exception):
    """The metadata could not be read; the message says what was asked and what came back."""


class Reader:
    """Reads and caches remote weights' metadata; one per control plane."""

    def __init__(self, *, hub_endpoint: str = "https://huggingface.co", mirror_url: str = "", token: str = "",
                 timeout_s: float = 10.0, retry_s: float = 60.0, on_read: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, transport: httpx.BaseTransport | None = None,
                 allow_private: Iterable[str] = (), cluster_ca: bytes | None = None) -> None:
        """``cluster_ca``: trusted beside the system's authorities, for this server's own ``/mirror`` served over
        TLS with a certificate of the cluster CA (``https://SERVER/mirror``); None: the system's alone."""
        self.hub_endpoint, self.mirror_url = hub_endpoint.rstrip("/"), mirror_url.rstrip("/")
        # No read reaches loopback, link-local or this host's addresses (``netguard``) but the cluster's
        # own hub and mirror, trusted by configuration, and what --fetch-allow-private names.
        self.policy = netguard.policy_of(allow_private, trusted=(u for u in (self.hub_endpoint, self.mirror_url) if u))
        self._token, self.timeout_s, self.retry_s = token, timeout_s, retry_s
        self.on_read, self._clock, self._transport = on_read, clock, transport
        self._verify: ssl.SSLContext | None = None
        if cluster_ca:
            self._verify = ssl.create_default_context(cafile=certifi.where())  # httpx's default, and the CA
            self._verify.load_verify_locations(cadata=cluster_ca.decode())
        #: By the fetched source's text (``needs.fetched_source``).
        self._known: dict[str, RemoteWeights] = {}
        self._read_at: dict[str, float] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def known(self) -> dict[str, RemoteWeights]:
        """A copy of every answer so far: what a pass reads (in its thread, while reads go on)."""
        return dict(self._known)

    def want(self, specs: Iterable[ModelSpec]) -> None:
        """Starts reading each remote source not read yet (or whose read failed ``retry_s`` ago); on the loop."""
        now = self._clock()
        for spec in specs:
            src = needs.fetched_source(spec)
            key = src.text if src is not None else ""
            if not key or key in self._tasks:
                continue
            old = self._known.get(key)
            if old is not None and (old.weight is not None or now - self._read_at.get(key, now) < self.retry_s):
                continue
            self._tasks[key] = asyncio.get_running_loop().create_task(self._read(key))

    async def _read(self, key: str) -> None:
        try:
            found = await asyncio.to_thread(self.read, key)
        finally:
            self._tasks.pop(key, None)
        self._known[key], self._read_at[key] = found, self._clock()
        if found.problem:
            log.warning("cannot read the metadata of %s: %s", key, found.problem)
        if self.on_read is not None:
            self.on_read()

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    # -- the reads (in a worker thread) ------------------------------------------------
    def client(self) -> httpx.Client:
        """An HTTP client under this reader's network guard and trust (``tokenizerfiles`` reads through it too)."""
        inner = self._transport or (httpx.HTTPTransport(verify=self._verify) if self._verify else None)
        return httpx.Client(timeout=self.timeout_s, transport=netguard.Transport(self.policy, inner),
                            follow_redirects=True)

    def auth_headers(self) -> dict[str, str]:
        """The hub token's header (the hub's own reads only; never sent to a mirror)."""
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def read(self, source: str) -> RemoteWeights:
        """The metadata of ``source`` (a fetched source's text), blocking; never raises: a failure gives the problem."""
        return self.read_facts(source)[0]

    def read_facts(self, source: str) -> tuple[RemoteWeights, modelfacts.Labels, dict[str, int]]:
        """``read``, with the words the headers state (architecture, dtype, quantisation) and the files read of,
        by name with their sizes (the deploy preview's; a pass needs only ``read``'s numbers)."""
        session: _Session | None = None
        try:
            src = sources.parse(source)
            with self.client() as http:
                session = _Session(http, self)
                weight = session.read(src)
        except (Unreadable, weightmeta.BadHeader, ValueError, netpolicy.Refused) as exc:
            return RemoteWeights(None, str(exc)), modelfacts.Labels(), {}
        except httpx.HTTPError as exc:
            return (RemoteWeights(None, f"{type(exc).__name__} from "
                                        f"{exc.request.url if _has_request(exc) else source}: {exc or 'no answer'}"),
                    modelfacts.Labels(), {})
        return RemoteWeights(dataclasses.replace(weight, source=source)), session.labels, session.files


def _has_request(exc: httpx.HTTPError) -> bool:
    try:
        exc.request  # noqa: B018 - raises RuntimeError when the error carries none
    except RuntimeError:
        return False
    return True


class _Session:
    """One source's reads over one HTTP client."""

    def __init__(self, http: httpx.Client, reader: Reader) -> None:
        self.http, self.reader = http, reader
        #: What the headers say in words, and the model's files with their sizes (for the deploy preview).
        self.labels = modelfacts.Labels()
        self.files: dict[str, int] = {}

    def _get(self, url: str, *, headers: dict[str, str] | None = None, auth: bool = False) -> httpx.Response:
        h = dict(headers or {})
        if auth and self.reader._token:
            h["Authorization"] = f"Bearer {self.reader._token}"
        resp = self.http.get(url, headers=h)
        if resp.status_code >= 400:
            raise Unreadable(f"GET {url}: HTTP {resp.status_code}")
        return resp

    def _range(self, url: str, start: int, end: int, *, auth: bool = False) -> bytes:
        """Bytes start..end (inclusive) of ``url``; a server that ignores Range is cut to what was asked."""
        return self._get(url, headers={"Range": f"bytes={start}-{end}"}, auth=auth).content[:end - start + 1]

    def _json(self, url: str, *, auth: bool = False) -> Any:
        try:
            return self._get(url, auth=auth).json()
        except ValueError as exc:
            raise Unreadable(f"GET {url}: not JSON ({exc})") from None

    def read(self, src: sources.Source) -> WeightFile:
        if src.kind == "hf":
            return self._hf(src)
        if src.kind == "mirror":
            return self._mirror(src)
        if src.kind == "http":
            return self._http(src.url)
        raise Unreadable(f"{src.text} is not a remote source")

    # -- hf://org/repo[@revision][/subpath] -----------------------------------------
    def _hf(self, src: sources.Source) -> WeightFile:
        source, repo, revision, subpath = src.text, src.repo, src.revision or "main", src.subpath
        base = self.reader.hub_endpoint
        info = self._json(f"{base}/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}?blobs=true",
                          auth=True)
        sha = info.get("sha") or revision if isinstance(info, dict) else revision
        sizes: dict[str, int] = {}
        for s in info.get("siblings", []) if isinstance(info, dict) else []:
            if isinstance(s, dict) and isinstance(s.get("rfilename"), str):
                size = s.get("size")
                if not isinstance(size, int) and isinstance(s.get("lfs"), dict):
                    size = s["lfs"].get("size")
                sizes[s["rfilename"]] = size if isinstance(size, int) else -1
        wanted = subpath if subpath.endswith(".gguf") else ""
        folder = "" if wanted else subpath.strip("/")

        def url(name: str) -> str:
            return f"{base}/{repo}/resolve/{sha}/{urllib.parse.quote(name)}"

        if wanted:
            if wanted not in sizes:
                raise Unreadable(f"{source} has no file {wanted} (it lists {len(sizes)} files)")
            size = sizes[wanted] if sizes[wanted] >= 0 else self._size(url(wanted), auth=True)
            self.files = {wanted: size}
            return WeightFile(path="", size_bytes=size, format="gguf", **self._gguf(url(wanted), auth=True))
        prefix = f"{folder}/" if folder else ""
        inside = {n[len(prefix):]: sz for n, sz in sizes.items() if n.startswith(prefix)}
        tensors = sorted(n for n in inside if n.endswith(".safetensors") and "/" not in n)
        if "config.json" not in inside or not tensors:
            ggufs = sorted(n for n in inside if n.endswith(".gguf"))
            hint = f"; name one with spec.source_file (it has {', '.join(ggufs[:3])})" if ggufs else ""
            raise Unreadable(f"{source} has no config.json and *.safetensors{' in ' + folder if folder else ''}"
                             f"{hint}")
        needed = [n for n in inside if "/" not in n and (n.endswith(".safetensors") or n.endswith(_TOKENIZER_SUFFIXES))]
        total = 0
        for n in needed:
            self.files[n] = inside[n] if inside[n] >= 0 else self._size(url(prefix + n), auth=True)
            total += self.files[n]
        return self._safetensors(lambda n: url(prefix + n), tensors, total, auth=True)

    def _size(self, url: str, *, auth: bool = False) -> int:
        h = {"Authorization": f"Bearer {self.reader._token}"} if auth and self.reader._token else {}
        resp = self.http.head(url, headers=h)
        if resp.status_code >= 400:
            raise Unreadable(f"HEAD {url}: HTTP {resp.status_code}")
        for name in ("X-Linked-Size", "Content-Length"):
            if resp.headers.get(name, "").isdigit():
                return int(resp.headers[name])
        raise Unreadable(f"HEAD {url}: no Content-Length")

    def _safetensors(self, url: Callable[[str], str], tensors: list[str], total: int, *, auth: bool) -> WeightFile:
        config = self._json(url("config.json"), auth=auth)
        numbers = weightmeta.config_numbers(config) if isinstance(config, dict) else {}
        headers = []
        for name in tensors if len(tensors) <= _HEADERS_READ else tensors[:1]:
            n = weightmeta.safetensors_header_length(self._range(url(name), 0, 7, auth=auth))
            headers.append(weightmeta.safetensors_params(self._range(url(name), 8, 8 + n - 1, auth=auth)))
        meta = weightmeta.safetensors_meta(numbers, headers)
        by_dtype: dict[str, int] = {}
        for count, dtype in headers:
            by_dtype[dtype] = by_dtype.get(dtype, 0) + count
        stored = max(by_dtype, key=lambda k: by_dtype[k]) if by_dtype else ""
        self.labels = modelfacts.config_labels(config if isinstance(config, dict) else {}, stored)
        if len(tensors) > _HEADERS_READ:
            meta.pop("params", None)  # one file's count of many: the size stands for the weights instead
        return WeightFile(path="", size_bytes=total, format="safetensors", **meta)

    def _gguf(self, url: str, *, auth: bool = False) -> weightmeta.Meta:
        n = _GGUF_FIRST
        while True:
            buf = self._range(url, 0, n - 1, auth=auth)
            try:
                values, params = weightmeta.gguf_values(buf)
                self.labels = modelfacts.gguf_labels(values)
                return weightmeta.gguf_numbers(values, params)
            except weightmeta.BadHeader as exc:
                if "ends early" not in str(exc) and "a string of" not in str(exc) or len(buf) < n or n >= _GGUF_MAX:
                    raise Unreadable(f"{url} is not a readable GGUF file ({exc})") from None
                n *= 4

    # -- https://host/file, mirror://name[/path] ----------------------------------------
    def _http(self, source: str) -> WeightFile:
        size = self._size(source)
        if source.split("?")[0].endswith(".gguf"):
            return WeightFile(path="", size_bytes=size, format="gguf", **self._gguf(source))
        return WeightFile(path="", size_bytes=size, format="")

    def _mirror(self, src: sources.Source) -> WeightFile:
        if not self.reader.mirror_url:
            raise Unreadable(f"{src.text} names the cluster's mirror, and no --mirror-url is set on the control plane")
        rest = f"{src.name}/{src.subpath}" if src.subpath else src.name
        listing = self._json(f"{self.reader.mirror_url}/api/files/{urllib.parse.quote(rest)}")
        entries = listing.get("files", []) if isinstance(listing, dict) else []
        files = {str(f.get("path", "")): int(f.get("size", 0)) for f in entries if isinstance(f, dict)}
        total = sum(files.values())
        self.files = dict(files)
        base = f"{self.reader.mirror_url}/files/{urllib.parse.quote(rest)}"
        # The asked path is one file when the listing says "" for it, or when it is a file to GET: a
        # listing of a file names it by its own name, as a directory holding one file would.
        if list(files) == [""] or (len(files) == 1 and self.http.head(base).status_code == 200):
            if rest.endswith(".gguf"):
                return WeightFile(path="", size_bytes=total, format="gguf", **self._gguf(base))
            return WeightFile(path="", size_bytes=total, format="")
        tensors = sorted(n for n in files if n.endswith(".safetensors") and "/" not in n)
        if "config.json" in files and tensors:
            return self._safetensors(lambda n: f"{base}/{urllib.parse.quote(n)}", tensors, total, auth=False)
        ggufs = sorted(n for n in files if n.endswith(".gguf"))
        if len(ggufs) == 1:
            return WeightFile(path="", size_bytes=total, format="gguf", **self._gguf(f"{base}/{ggufs[0]}"))
        return WeightFile(path="", size_bytes=total, format="")
