"""What one request means in files: for each, the URL, its place in the cache entry, its size and sha256.

* http(s): one file; a HEAD gives its size (for the disk check) before any byte is fetched.
* hf: the endpoint's HF API resolves the revision to a commit and lists the repository
  (``GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true``: ``sha``, ``siblings[].rfilename``, ``size``,
  ``lfs.sha256``); the files an engine needs are fetched from ``{endpoint}/{repo}/resolve/{sha}/{file}``,
  pinned to the commit so a branch moving mid-download cannot mix two revisions. A file the listing gives
  no size for is asked with a HEAD (X-Linked-Size / Content-Length, and X-Linked-Etag: the LFS sha256).
* mirror: ``GET {endpoint}/api/files/{name}/{path}`` lists a file or a tree with sizes (paths relative to
  the name); each file comes from ``{endpoint}/files/{name}/{file}``.

Names that come from a server (a listing, an API) are checked to be plain relative paths before they are
used: a buggy or hostile listing naming ``../../etc/x`` must not write outside the partial directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
import urllib.parse
from typing import Any

import aiohttp

from llmgw.agent.fetch import guard, records, transfer
from llmgw.core import errors, netpolicy

# What vLLM and SGLang read from a snapshot: weights, configs, tokenizer files, chat templates.
_NEEDED_SUFFIXES = (".safetensors", ".json", ".model", ".txt", ".tiktoken", ".jinja")


@dataclasses.dataclass(slots=True)
class Plan:
    jobs: list[records.FileJob]
    rel: str = ""           # the path inside the entry that ensure() returns; "" = the entry (a directory)
    note: str = ""          # what was resolved (a commit), for the log


async def make(session: aiohttp.ClientSession, req: records.Request, *, timeout_s: float) -> Plan:
    """The files ``req`` stands for; Retry for what may pass, FetchError for what will not."""
    src = req.source
    if src.kind == "http":
        return await _http(session, req, timeout_s=timeout_s)
    if not req.endpoint:
        what = "hub endpoint (--hub-endpoint)" if src.kind == "hf" else "mirror URL (--mirror-url)"
        raise errors.FetchError(f"{src.text} needs the cluster's {what}, and the agent was given none; set it on "
                                "the control plane")
    if src.kind == "hf":
        return await _hf(session, req, timeout_s=timeout_s)
    if src.kind == "mirror":
        return await _mirror(session, req, timeout_s=timeout_s)
    raise errors.FetchError(f"{src.text} is a {src.kind} source, which is on the node already; nothing to fetch")


async def _http(session: aiohttp.ClientSession, req: records.Request, *, timeout_s: float) -> Plan:
    url = req.source.url
    job = records.FileJob(url=url, rel=_basename(url), sha256=req.sha256.lower())
    status, headers = await _head(session, url, {}, timeout_s=timeout_s)
    if status in (401, 403, 404, 410):
        transfer._refuse(status, job, urllib.parse.urlsplit(url).netloc)
    if 200 <= status < 300 and headers.get("Content-Length", "").isdigit():
        job.size = int(headers["Content-Length"])
    # Any other answer (405 to a HEAD, a 5xx) leaves the size to the GET, which states it before its body.
    return Plan(jobs=[job], rel=job.rel)


async def _hf(session: aiohttp.ClientSession, req: records.Request, *, timeout_s: float) -> Plan:
    src = req.source
    base = req.endpoint.rstrip("/")
    auth = {"Authorization": f"Bearer {req.token}"} if req.token else {}
    rev = src.revision or "main"
    api = f"{base}/api/models/{src.repo}/revision/{urllib.parse.quote(rev, safe='')}"
    # blobs=true: the hub then lists each file's size and LFS sha256, sparing a HEAD per file.
    doc = await _json(session, api + "?blobs=true", auth, what=f"{src.repo}@{rev}", timeout_s=timeout_s)
    commit = str(doc.get("sha") or rev)
    siblings = {str(s.get("rfilename")): s for s in doc.get("siblings", []) if isinstance(s, dict)}
    names = _pick_hf(src.text, src.subpath, sorted(siblings), rev=rev)
    prefix = f"{src.subpath}/" if src.subpath and src.subpath not in siblings else ""
    jobs = []
    for name in names:
        s = siblings[name]
        lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else {}
        url = f"{base}/{src.repo}/resolve/{commit}/{urllib.parse.quote(name)}"
        rel = _safe_rel(name.removeprefix(prefix) if prefix else posixpath.basename(name), src.text)
        job = records.FileJob(url=url, rel=rel, size=int(s.get("size") or lfs.get("size") or 0),
                              sha256=str(lfs.get("sha256") or "").lower(), headers=dict(auth))
        if not job.size:
            status, headers = await _head(session, url, auth, timeout_s=timeout_s)
            if 200 <= status < 400:
                size = headers.get("X-Linked-Size") or headers.get("Content-Length") or "0"
                job.size = int(size) if size.isdigit() else 0
                job.sha256 = job.sha256 or transfer.hub_sha256(headers)
        jobs.append(job)
    single = len(names) == 1 and names[0].endswith(".gguf")
    return Plan(jobs=jobs, rel=jobs[0].rel if single else "", note=f"{src.repo}@{rev} is commit {commit}")


def _pick_hf(text: str, subpath: str, names: list[str], *, rev: str) -> list[str]:
    """The files of a repository an engine needs: the one file named, or weights, configs and tokenizer."""
    if subpath in names:
        return [subpath]
    prefix = f"{subpath}/" if subpath else ""
    here = [n for n in names if n.startswith(prefix) and "/" not in n[len(prefix):]]
    if subpath and not any(n.startswith(prefix) for n in names):
        shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
        raise errors.FetchError(f"{text}: the repository has no file or folder {subpath!r} at {rev} "
                                f"(it has {shown}); correct the path after the repository name")
    if any(n.endswith(".safetensors") for n in here):
        return [n for n in here if n.endswith(_NEEDED_SUFFIXES) or posixpath.basename(n).startswith("tokenizer")]
    ggufs = [n for n in here if n.endswith(".gguf")]
    if len(ggufs) == 1:
        return ggufs
    if ggufs:
        raise errors.FetchError(f"{text} holds {len(ggufs)} .gguf files ({', '.join(ggufs[:6])}); name one with "
                                "spec.source_file or as hf://ORG/REPO/FILE.gguf")
    raise errors.FetchError(f"{text} has no *.safetensors or .gguf weights at {rev}"
                            + (f" in {subpath!r}" if subpath else "") + "; name a repository (or folder) that has")


async def _mirror(session: aiohttp.ClientSession, req: records.Request, *, timeout_s: float) -> Plan:
    src = req.source
    base = req.endpoint.rstrip("/")
    where = f"{src.name}/{src.subpath}" if src.subpath else src.name
    quoted = urllib.parse.quote(where)
    doc = await _json(session, f"{base}/api/files/{quoted}", {}, what=src.text, timeout_s=timeout_s)
    files = [f for f in doc.get("files", []) if isinstance(f, dict)]
    if not files:
        raise errors.FetchError(f"the mirror holds nothing under {src.text}; add it to the mirror first")
    # Listed paths are relative to the name; a file lists itself.
    sub = src.subpath
    if len(files) == 1 and str(files[0].get("path", "")) in (sub, ""):
        rel = _safe_rel(posixpath.basename(where), src.text)
        job = records.FileJob(url=f"{base}/files/{quoted}", rel=rel, size=int(files[0].get("size") or 0),
                              sha256=(req.sha256 or str(files[0].get("sha256") or "")).lower())
        return Plan(jobs=[job], rel=rel)
    jobs = []
    prefix = f"{sub}/" if sub else ""
    for f in files:
        path = _safe_rel(str(f.get("path", "")), src.text)
        if not path.startswith(prefix):
            raise errors.FetchError(f"the mirror listed {path!r} under {src.text}, which is outside it; the fetch "
                                    "was refused (check the mirror's version)")
        jobs.append(records.FileJob(url=f"{base}/files/{urllib.parse.quote(src.name)}/{urllib.parse.quote(path)}",
                                    rel=path[len(prefix):], size=int(f.get("size") or 0),
                                    sha256=str(f.get("sha256") or "").lower()))
    return Plan(jobs=jobs)


async def _head(session: aiohttp.ClientSession, url: str, headers: dict[str, str], *,
                timeout_s: float) -> tuple[int, Any]:
    try:
        async with asyncio.timeout(timeout_s), session.head(url, headers=headers, allow_redirects=False) as resp:
            return resp.status, resp.headers
    except TimeoutError:
        raise transfer.Stalled(f"no answer from {urllib.parse.urlsplit(url).netloc} for {timeout_s:g} s") from None
    except guard.AddressRefused as exc:
        raise netpolicy.Refused(f"spec.source {url}: {exc.refused}") from None
    except aiohttp.ClientError as exc:
        raise transfer.Retry(f"cannot reach {urllib.parse.urlsplit(url).netloc}: {exc}") from None


async def _json(session: aiohttp.ClientSession, url: str, headers: dict[str, str], *, what: str,
                timeout_s: float) -> dict[str, Any]:
    host = urllib.parse.urlsplit(url).netloc
    try:
        async with asyncio.timeout(timeout_s), session.get(url, headers=headers) as resp:
            if resp.status in (401, 403):
                raise errors.FetchError(f"{host} refused {what} ({resp.status}): a gated or private repository "
                                        "needs a token (LLMGW_HF_TOKEN or --hub-token-file on the control plane)")
            if resp.status == 404:
                raise errors.FetchError(f"{host} has no {what} (404); check the name and revision, or add it to "
                                        "the cluster's mirror")
            if resp.status >= 500 or resp.status == 429:
                raise transfer.Retry(f"{host} answered {resp.status} for {what}")
            if resp.status != 200:
                raise errors.FetchError(f"{host} answered {resp.status} for {what}; check the endpoint URL")
            doc = await resp.json(content_type=None)
    except TimeoutError:
        raise transfer.Stalled(f"no answer from {host} for {timeout_s:g} s") from None
    except guard.AddressRefused as exc:
        raise netpolicy.Refused(f"{what} at {url}: {exc.refused}") from None
    except aiohttp.ClientError as exc:
        raise transfer.Retry(f"cannot reach {host}: {exc}") from None
    except ValueError:
        raise errors.FetchError(f"{url} did not answer JSON; is the endpoint an HF-compatible one?") from None
    if not isinstance(doc, dict):
        raise errors.FetchError(f"{url} answered something other than a JSON object; check the endpoint URL")
    return doc


def _basename(url: str) -> str:
    name = posixpath.basename(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return _safe_rel(name, url)


def _safe_rel(rel: str, text: str) -> str:
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") or "\\" in p or "\x00" in p for p in parts):
        raise errors.FetchError(f"{text}: the server named a file {rel!r}, which is not a plain relative path; "
                                "the fetch was refused (check the server's listing)")
    return rel

