"""The mirror's HTTP API, as one ASGI app: ``build(dir, upstream=..., admin_token=...)``.

Routes (reads need no credentials; the admin routes need an administrator's credential):

- ``GET|HEAD /files/<name>/<path>``: ``mirror://name/path``, with Range (206, 416), and
  ``GET /api/files/<name>[/<path>]``: the files under it with their sizes (for a directory source).
- The Hugging Face subset ``huggingface_hub`` uses (read from its ``snapshot_download``,
  ``hf_hub_download`` and ``HfApi.repo_info``/``list_repo_tree``):
  ``GET /api/models/<org>/<repo>[/revision/<rev>]`` (``sha``, ``siblings`` with ``rfilename``, ``size``,
  ``blobId``, ``lfs``), ``GET /api/models/<org>/<repo>/tree/<rev>[/<path>]`` (``?recursive=true``; what
  ``snapshot_download`` lists files with), and ``GET|HEAD /<org>/<repo>/resolve/<rev>/<path>`` with the
  headers its ``get_hf_file_metadata`` reads: ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag`` and
  ``X-Linked-Size`` (every file is served LFS-style, its sha256 as the etag, so a client can verify any
  file), ``Content-Length`` and ``Accept-Ranges``. No ``X-Xet-*`` header is ever sent: with one the client
  would switch to the Xet protocol, which the mirror does not speak. Refusals carry the Hub's
  ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) so the client raises the
  matching exception.
- ``POST /admin/add`` ``{"source": "hf://org/repo[@rev][/path]"}``: pre-load through the upstream.
- ``GET /admin/stats``: upstream API calls, file fetches per file, bytes (what tests and benches assert on);
  an administrator's: the admin token, a mounting control plane's admin, or (no admin token) loopback.
- ``GET /healthz``.

``llmgw server --mirror-dir DIR`` serves it at ``/mirror`` (``llmgw.serve``), the HF endpoint then being
``http://HOST:PORT/mirror``. A mounted app's lifespan does not run, so whoever mounts it closes its
upstream client at shutdown (``app.state.mirror.aclose()``), as the server does.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from llmgw.mirror import admin, hubdocs, paths, pull
from llmgw.mirror import store as store_mod
from llmgw.mirror import upstream as upstream_mod

log = logging.getLogger(__name__)

_HF_SOURCE = re.compile(r"hf://([^/@]+)/([^/@]+)(?:@([^/]+))?(?:/(.+))?")


class Refusal(Exception):
    """An answer other than 200: the status, a sentence saying why and what to do, and the Hub's error code."""

    def __init__(self, status: int, message: str, *, code: str = "", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}
        super().__init__(message)


class _File(FileResponse):
    # 1 MiB reads rather than starlette's 64 KiB: fewer awaits and syscalls per GB sent.
    chunk_size = 1 << 20


def _file(request: Request, disk: Path, st: os.stat_result, headers: dict[str, str] | None = None) -> Response:
    """``disk`` with Range support; a range past its end is refused with a sentence (starlette's 416 has none)."""
    header = request.headers.get("range")
    if header and _one_range(header, st.st_size) is None:
        raise Refusal(416, f"the range {header!r} is outside the file's {st.st_size} bytes: ask for bytes=START-END "
                           f"with START below {st.st_size}", headers={"Content-Range": f"bytes */{st.st_size}"})
    return _File(disk, headers=headers, stat_result=st, media_type="application/octet-stream")


class Mirror:
    """The app's state: the directory, the upstream (if any) and the admin token (if any)."""

    def __init__(self, root: Path, *, upstream: str = "", admin_token: str = "", upstream_token: str = "",
                 stats_auth: admin.StatsAuth | None = None) -> None:
        self.store = store_mod.Store(root)
        self.upstream = upstream_mod.Upstream(upstream, token=upstream_token) if upstream else None
        self.puller = pull.Puller(self.store, self.upstream) if self.upstream else None
        self.admin_token = admin_token
        #: Mounted in a control plane: whether a bearer token is one of its admins' (``llmgw.serve``).
        self.stats_auth = stats_auth

    # -- revisions -----------------------------------------------------------------------------------------

    async def revision(self, repo: str, rev: str) -> store_mod.Revision:
        """The revision ``rev`` of ``repo``: from the directory, else (once for a crowd) from the upstream."""
        sha = await asyncio.to_thread(self.store.sha_for, repo, rev)
        if sha:
            found = await asyncio.to_thread(self.store.revision, repo, sha)
            if found is not None:
                return found
        if self.puller is None:
            repo_dir = self.store.repo_dir(repo)
            if not repo_dir.is_dir():
                # The directory relative to the mirror's: a client learns nothing of the server's disk.
                raise Refusal(404, f"the mirror has no repository {repo}: copy it into hf/{repo}/ under the "
                                   "mirror's directory, or start the mirror with --upstream", code="RepoNotFound")
            raise Refusal(404, f"the mirror has no revision {rev!r} of {repo} (no refs/{rev} and no commit of that "
                               "name): pre-load it with `llmgw mirror add`, or start the mirror with --upstream",
                          code="RevisionNotFound")
        return await self.puller.revision(repo, rev, lambda: self._from_upstream(repo, rev))

    async def _from_upstream(self, repo: str, rev: str) -> store_mod.Revision:
        assert self.upstream is not None
        try:
            sha = rev if store_mod.SHA.fullmatch(rev) else await self.upstream.revision(repo, rev)
            found = await asyncio.to_thread(self.store.revision, repo, sha)
            if found is None:
                entries = await self.upstream.tree(repo, sha)
                found = await asyncio.to_thread(self.store.save_upstream, repo, sha, entries)
        except upstream_mod.UpstreamError as e:
            raise Refusal(e.status, e.message, code=e.code) from None
        await asyncio.to_thread(self.store.set_ref, repo, rev, sha)
        return found

    # -- files ---------------------------------------------------------------------------------------------

    async def serve_file(self, request: Request, repo: str, rev: store_mod.Revision, path: str) -> Response:
        entry = rev.files.get(path)
        commit = {"X-Repo-Commit": rev.sha}
        if entry is None:
            raise Refusal(404, f"{repo}@{rev.sha} has no file {path!r}", code="EntryNotFound", headers=commit)
        headers = {**commit, "ETag": f'"{entry.etag}"', "X-Linked-Size": str(entry.size), "Accept-Ranges": "bytes"}
        if entry.sha256:
            headers["X-Linked-Etag"] = f'"{entry.sha256}"'
        disk = self.store.snapshot_file(repo, rev.sha, path)
        try:
            st = disk.stat()
        except FileNotFoundError:
            st = None
        if st is not None and st.st_size == entry.size:
            return _file(request, disk, st, headers)
        if self.puller is None or rev.origin != "upstream":
            raise Refusal(404, f"{repo}@{rev.sha}/{path} is listed but not on the mirror's disk (hf/{repo}/{rev.sha}/"
                               f"{path} under its directory): copy it back, or start the mirror with --upstream",
                          code="EntryNotFound", headers=commit)
        if request.method == "HEAD":
            # A HEAD only asks for metadata (hf_hub_download sends one before its GET): it starts no download.
            return Response(headers={**headers, "Content-Length": str(entry.size),
                                     "Content-Type": "application/octet-stream"})
        return _Growing(self.puller.file(repo, rev.sha, entry), headers)

    async def add(self, source: str) -> dict[str, Any]:
        """Pre-loads ``hf://org/repo[@rev][/path]``: resolves the revision upstream and fetches what is missing."""
        m = _HF_SOURCE.fullmatch(source)
        if m is None:
            raise Refusal(400, f"cannot add {source!r}: write hf://org/repo[@revision][/path]")
        repo, rev, sub = f"{m[1]}/{m[2]}", m[3] or "main", m[4] or ""
        self.store.repo_dir(repo)
        if self.puller is None:
            found = await self.revision(repo, rev)   # already here: nothing to do; else the refusal says why
        else:
            # An add refreshes a branch from the upstream; a plain read serves the branch the mirror has.
            found = await self.puller.revision(repo, rev, lambda: self._from_upstream(repo, rev))
        folder = sub.rstrip("/") + "/"
        wanted = [e for p, e in sorted(found.files.items()) if not sub or p == sub or p.startswith(folder)]
        if not wanted:
            raise Refusal(404, f"{repo}@{found.sha} has no file {sub!r}")
        pulls = []
        for e in wanted:
            if not self.store.snapshot_file(repo, found.sha, e.path).is_file() and self.puller is not None:
                pulls.append(self.puller.file(repo, found.sha, e))
        for p in pulls:
            await p.wait_finished()
        failed = [p.error for p in pulls if p.error]
        if failed:
            raise Refusal(502, f"{len(failed)} of {len(wanted)} files failed: " + "; ".join(failed))
        return {"repo": repo, "revision": rev, "sha": found.sha, "files": len(wanted), "fetched": len(pulls),
                "bytes": sum(e.size for e in wanted)}

    def check_admin(self, request: Request) -> None:
        if not self.admin_token:
            raise Refusal(403, "the admin API is off: start the mirror with --admin-token-file FILE (or the "
                               "LLMGW_MIRROR_ADMIN_TOKEN environment variable) to enable it")
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.admin_token.encode()):
            raise Refusal(401, "the admin API needs the mirror's admin token: send 'Authorization: Bearer TOKEN' "
                               "(llmgw mirror add reads it from --admin-token-file or LLMGW_MIRROR_ADMIN_TOKEN)")

    async def check_stats(self, request: Request) -> None:
        """``/admin/stats`` is an administrator's (``admin.stats_refusal`` says who that is)."""
        refused = await admin.stats_refusal(request, admin_token=self.admin_token, stats_auth=self.stats_auth)
        if refused:
            raise Refusal(401, refused)

    async def aclose(self) -> None:
        if self.puller is not None:
            await self.puller.aclose()
        if self.upstream is not None:
            await self.upstream.aclose()


class _Growing:
    """The response for a file being pulled: streams it from the temporary file as the download writes it."""

    def __init__(self, p: pull.Pull, headers: dict[str, str]) -> None:
        self.pull = p
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = self.pull.entry.size
        request = Request(scope)
        span = _one_range(request.headers.get("range"), size)
        if span is None:
            return await _refusal(Refusal(416, f"the range {request.headers.get('range')!r} is outside the file's "
                                               f"{size} bytes: ask for bytes=START-END with START below {size}",
                                          headers={"Content-Range": f"bytes */{size}"}))(scope, receive, send)
        start, end, partial = span
        headers = {**self.headers, "Content-Length": str(end - start), "Content-Type": "application/octet-stream"}
        if partial:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        try:
            fd = os.open(self.pull.tmp, os.O_RDONLY)
        except FileNotFoundError:
            await self.pull.wait_finished()
            if self.pull.error:
                return await _refusal(Refusal(502, self.pull.error))(scope, receive, send)
            fd = os.open(self.pull.final, os.O_RDONLY)
        try:
            await send({"type": "http.response.start", "status": 206 if partial else 200,
                        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})
            pos = start
            while pos < end:
                await self.pull.wait_past(pos)
                if self.pull.error:
                    # Ends the response short of its Content-Length: the client sees a broken transfer.
                    raise RuntimeError(f"pull-through failed: {self.pull.error}")
                stop = min(self.pull.available(), end)
                while pos < stop:
                    chunk = os.pread(fd, min(pull.CHUNK, stop - pos), pos)
                    if not chunk:
                        raise RuntimeError(f"{self.pull.tmp} is shorter than the download says")
                    pos += len(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            os.close(fd)


def _one_range(header: str | None, size: int) -> tuple[int, int, bool] | None:
    """(start, end, partial) for a single ``bytes=`` range; the whole file for none (or several); None: 416."""
    if not header or not header.startswith("bytes=") or "," in header:
        return 0, size, False
    first, _, last = header[len("bytes="):].strip().partition("-")
    try:
        if not first:
            n = int(last)
            return (max(size - n, 0), size, True) if n > 0 else None
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return 0, size, False
    return (start, end, True) if start < end else None


def _refusal(e: Refusal) -> Response:
    headers = dict(e.headers)
    if e.code:
        headers["X-Error-Code"] = e.code
        headers["X-Error-Message"] = e.message.encode("ascii", "replace").decode()
    return JSONResponse({"error": e.message}, status_code=e.status, headers=headers)


def _repo(request: Request) -> str:
    return f"{request.path_params['org']}/{request.path_params['repo']}"


def build(root: Path | str, *, upstream: str = "", admin_token: str = "", upstream_token: str = "",
          stats_auth: admin.StatsAuth | None = None) -> Starlette:
    """The mirror's ASGI app serving ``root`` (created if missing); ``stats_auth`` as ``Mirror`` takes it."""
    mirror = Mirror(Path(root), upstream=upstream, admin_token=admin_token, upstream_token=upstream_token,
                    stats_auth=stats_auth)

    async def healthz(_r: Request) -> Response:
        return PlainTextResponse("ok")

    async def mirror_file(request: Request) -> Response:
        name, path = request.path_params["name"], request.path_params["path"]
        disk = mirror.store.mirror_file(name, path)
        if not disk.is_file():
            hint = f"; list it at /api/files/{name}/{path}" if disk.is_dir() else ""
            raise Refusal(404, f"the mirror has no file mirror://{name}/{path}{hint}")
        return _file(request, disk, disk.stat())

    async def mirror_listing(request: Request) -> Response:
        name, path = request.path_params["name"], request.path_params.get("path", "")
        listing = await asyncio.to_thread(mirror.store.mirror_listing, name, path)
        if not listing:
            raise Refusal(404, f"the mirror has nothing at mirror://{name}{'/' + path if path else ''}")
        return JSONResponse({"name": name, "files": [{"path": p, "size": s} for p, s in listing]})

    async def model_info(request: Request) -> Response:
        repo = _repo(request)
        rev = await mirror.revision(repo, request.path_params.get("rev", "main"))
        return JSONResponse(hubdocs.model_info(repo, rev))

    async def tree(request: Request) -> Response:
        repo = _repo(request)
        rev = await mirror.revision(repo, request.path_params["rev"])
        base = request.path_params.get("path", "").strip("/")
        recursive = request.query_params.get("recursive", "false").lower() in ("1", "true")
        items = hubdocs.tree(rev, base, recursive=recursive)
        if items is None:
            raise Refusal(404, f"{repo}@{rev.sha} has no folder {base!r}", code="EntryNotFound",
                          headers={"X-Repo-Commit": rev.sha})
        return JSONResponse(items)

    async def resolve(request: Request) -> Response:
        repo = _repo(request)
        rev = await mirror.revision(repo, request.path_params["rev"])
        return await mirror.serve_file(request, repo, rev, paths.relative(request.path_params["path"]))

    async def admin_add(request: Request) -> Response:
        mirror.check_admin(request)
        try:
            body = await request.json()
            source = str(body["source"])
        except (ValueError, KeyError, TypeError):
            raise Refusal(400, 'the body must be JSON like {"source": "hf://org/repo@main"}') from None
        return JSONResponse(await mirror.add(source))

    async def admin_stats(request: Request) -> Response:
        await mirror.check_stats(request)
        up = mirror.upstream
        return JSONResponse({"upstream": {"url": up.base_url, **up.stats.to_doc()} if up else None})

    async def on_refusal(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refusal)
        return _refusal(exc)

    async def on_path(_r: Request, exc: Exception) -> Response:
        assert isinstance(exc, paths.PathRefused)
        return _refusal(Refusal(exc.status, exc.message))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        said = (f"no such route: {request.method} {request.url.path} (the mirror serves /files/NAME/PATH, "
                "/api/models/ORG/REPO, /ORG/REPO/resolve/REV/PATH and /admin/...)" if exc.status_code == 404
                else f"{request.method} is not allowed on {request.url.path}")
        return _refusal(Refusal(exc.status_code, said))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await mirror.aclose()

    routes = [
        Route("/healthz", healthz),
        Route("/admin/stats", admin_stats),
        Route("/admin/add", admin_add, methods=["POST"]),
        Route("/files/{name}/{path:path}", mirror_file, methods=["GET", "HEAD"]),
        Route("/api/files/{name}", mirror_listing),
        Route("/api/files/{name}/{path:path}", mirror_listing),
        Route("/api/models/{org}/{repo}", model_info),
        Route("/api/models/{org}/{repo}/revision/{rev}", model_info),
        Route("/api/models/{org}/{repo}/tree/{rev}", tree),
        Route("/api/models/{org}/{repo}/tree/{rev}/{path:path}", tree),
        Route("/{org}/{repo}/resolve/{rev}/{path:path}", resolve, methods=["GET", "HEAD"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={Refusal: on_refusal, paths.PathRefused: on_path, HTTPException: on_http})
    app.state.mirror = mirror
    return app
