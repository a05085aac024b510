"""The upstream endpoint (the Hub, or another mirror): every call to it is made here, and counted.

The counts are what ``/admin/stats`` shows, so a test or a bench can assert that N nodes asking for a model
caused one download per file from outside the cluster.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from llmgw.mirror import guard
from llmgw.mirror import store as store_mod


class UpstreamError(Exception):
    """The upstream refused or failed; ``status`` is what the mirror answers (404 passes through, else 502)."""

    def __init__(self, status: int, message: str, *, code: str = "") -> None:
        self.status = status
        self.message = message
        self.code = code   # the Hub's X-Error-Code when it gave one (RepoNotFound, RevisionNotFound, ...)
        super().__init__(message)


@dataclasses.dataclass
class Stats:
    api_calls: int = 0
    file_fetches: int = 0
    bytes: int = 0
    files: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def to_doc(self) -> dict[str, Any]:
        return {"api_calls": self.api_calls, "file_fetches": self.file_fetches, "bytes": self.bytes,
                "files": dict(self.files)}


class Upstream:
    """An HF-compatible endpoint the mirror pulls through from."""

    def __init__(self, base_url: str, *, token: str = "") -> None:
        self.base_url = base_url.rstrip("/")
        self.stats = Stats()
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop (aiohttp binds a session to the loop that made it).
        # aiohttp rather than httpx: its C parser streamed a 1 GiB pull-through several times faster here.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # Every hop's address is checked (``guard``): a redirect to loopback or link-local is refused.
                connector=guard.Connector(guard.policy_for(self.base_url)),
                headers=self._headers, auto_decompress=False,
                # Per read, not per file: a 100 GB file takes as long as it takes, a silent upstream does not.
                timeout=aiohttp.ClientTimeout(total=None, connect=30.0, sock_read=120.0))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get_json(self, url: str, what: str, params: dict[str, str] | None = None) -> tuple[Any, str]:
        """(the JSON body, the next page's URL or "") of a GET that must answer 200."""
        self.stats.api_calls += 1
        try:
            async with self._client().get(url, params=params) as r:
                if r.status != 200:
                    raise _refused(r.status, r.headers, await r.text(), what, self.base_url)
                doc = await r.json(content_type=None)
                nxt = r.links.get("next", {}).get("url")
                return doc, str(nxt) if nxt else ""
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise UpstreamError(502, f"the upstream {self.base_url} did not answer for {what}: {e!r}") from None

    async def revision(self, repo: str, rev: str) -> str:
        """The commit sha ``rev`` resolves to upstream."""
        doc, _ = await self._get_json(f"{self.base_url}/api/models/{repo}/revision/{quote(rev, safe='')}",
                                      f"{repo}@{rev}")
        sha = doc.get("sha", "") if isinstance(doc, dict) else ""
        if not store_mod.SHA.fullmatch(sha or ""):
            raise UpstreamError(502, f"the upstream {self.base_url} gave no commit sha for {repo}@{rev}")
        return str(sha)

    async def tree(self, repo: str, sha: str) -> list[store_mod.Entry]:
        """Every file of the commit, with its size and (for LFS files) sha256, following the listing's pages."""
        url = f"{self.base_url}/api/models/{repo}/tree/{sha}"
        params: dict[str, str] | None = {"recursive": "true"}
        entries: list[store_mod.Entry] = []
        while url:
            doc, url = await self._get_json(url, f"the file list of {repo}@{sha}", params)
            for item in doc:
                if item.get("type") == "file":
                    lfs = item.get("lfs") or {}
                    entries.append(store_mod.Entry(item["path"], int(item["size"]), str(lfs.get("oid", "")),
                                                   str(item.get("oid", ""))))
            params = None   # the next page's URL carries its own query
        return entries

    @contextlib.asynccontextmanager
    async def download(self, repo: str, sha: str, path: str) -> AsyncIterator[aiohttp.StreamReader]:
        """The file's bytes as the upstream sends them (status checked), counted as one file fetch."""
        self.stats.file_fetches += 1
        self.stats.files[f"{repo}@{sha}/{path}"] += 1
        url = f"{self.base_url}/{repo}/resolve/{sha}/{quote(path)}"
        what = f"{repo}@{sha}/{path}"
        try:
            async with self._client().get(url, headers={"Accept-Encoding": "identity"}) as r:
                if r.status != 200:
                    raise _refused(r.status, r.headers, await r.text(), what, self.base_url)
                yield r.content
        except (aiohttp.ClientError, TimeoutError) as e:
            raise UpstreamError(502, f"the upstream {self.base_url} failed while sending {what}: {e!r}") from None


def _refused(status: int, headers: Mapping[str, str], text: str, what: str, base: str) -> UpstreamError:
    code = headers.get("X-Error-Code", "")
    said = headers.get("X-Error-Message", "") or text[:200]
    return UpstreamError(404 if status == 404 else 502, f"the upstream {base} answered {status} for {what}: {said}",
                         code=code)
