"""The weights mirror over real HTTP: Range, path refusals, the real huggingface_hub client, pull-through, admin.

Every mirror here is a real ``llmgw mirror`` process on a free 127.0.0.1 port; the "hub" of a pull-through
test is a second mirror. The huggingface_hub client runs in a child process whose environment has no token,
an empty HF_HOME, and a dead proxy for everything but 127.0.0.1, so nothing can reach the internet.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from llmgw.testing import hfrepo, procs

REPO = "org/tiny"


@contextlib.contextmanager
def running_mirror(tmp: Path, root: Path, *, upstream: str = "", token: str = "") -> Iterator[str]:
    """A ``llmgw mirror`` serving ``root``; yields its URL and stops it (by its pid) whatever happens."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "llmgw", "mirror", "--dir", str(root), "--port", str(port), "--log-level", "warning"]
    if upstream:
        argv += ["--upstream", upstream]
    if token:
        token_file = tmp / f"token-{port}"
        token_file.write_text(token + "\n")
        argv += ["--admin-token-file", str(token_file)]
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_MIRROR_ADMIN_TOKEN"}
    url = f"http://127.0.0.1:{port}"
    with procs.Proc.start(argv, env=env, log_path=tmp / f"mirror-{port}.log") as proc:
        proc.wait_http(url + "/healthz", timeout=30)
        yield url


def request(url: str, path: str, *, method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request; the path is sent exactly as given (no client-side '..' normalisation)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        r = conn.getresponse()
        try:
            body = r.read()
        except http.client.IncompleteRead as e:
            body = e.partial   # a response cut short; the caller checks its length
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body
    finally:
        conn.close()


HF_CLIENT = r"""
import json, sys, threading
import huggingface_hub as h
endpoint, mode, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
results, errors = [], []
def one(i):
    try:
        if mode == "snapshot":
            results.append(h.snapshot_download("org/tiny", revision="main", endpoint=endpoint, token=False,
                                               cache_dir=f"{out}/cache{i}", local_dir=f"{out}/local{i}"))
            results.append(h.snapshot_download("org/tiny", endpoint=endpoint, token=False, cache_dir=f"{out}/c{i}"))
        else:  # hf_hub_download, with the endpoint from HF_ENDPOINT
            results.append(h.hf_hub_download("org/tiny", "config.json", token=False, cache_dir=f"{out}/cache{i}"))
            results.append(h.hf_hub_download("org/tiny", "model-00002-of-00002.safetensors", token=False,
                                             cache_dir=f"{out}/cache{i}", local_dir=f"{out}/local{i}"))
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({"results": results, "errors": errors}))
"""


def hf_client(tmp: Path, endpoint: str, mode: str, *, clients: int = 1) -> dict[str, list[str]]:
    """Runs the real huggingface_hub client against ``endpoint`` in a child with no token and no internet."""
    home = tmp / f"hf-home-{mode}-{clients}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and "proxy" not in k.lower()}
    env.update(HF_HOME=str(home), HF_ENDPOINT=endpoint, HF_HUB_OFFLINE="0", HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_IMPLICIT_TOKEN="1", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
               NO_PROXY="127.0.0.1,localhost")
    out = tmp / f"hf-out-{mode}-{clients}"
    done = subprocess.run([sys.executable, "-c", HF_CLIENT, endpoint, mode, str(out), str(clients)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_tree(got: Path, want: dict[str, bytes]) -> None:
    files = {str(p.relative_to(got)): p.read_bytes() for p in got.rglob("*")
             if p.is_file() and ".cache" not in p.relative_to(got).parts}
    assert sorted(files) == sorted(want)
    for name, data in want.items():
        assert files[name] == data, name


def stats(url: str, *, token: str = "") -> dict[str, object]:
    """The upstream counts; a mirror with an admin token shows them only with it (test_mirror_guard)."""
    req = urllib.request.Request(url + "/admin/stats", headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())["upstream"]


def test_files_range_head_and_416(tmp_path: Path) -> None:
    """mirror:// files answer GET, HEAD (no body), single and suffix Ranges with 206, and 416 past the end."""
    root = tmp_path / "m"
    data = bytes(range(256)) * 4096   # 1 MiB
    hfrepo.write_files(root, "blob", {"w.bin": data, "sub/x.txt": b"hello"})
    with running_mirror(tmp_path, root) as url:
        status, headers, body = request(url, "/files/blob/w.bin")
        assert (status, body) == (200, data) and headers["accept-ranges"] == "bytes"
        status, headers, body = request(url, "/files/blob/w.bin", method="HEAD")
        assert (status, headers["content-length"], body) == (200, str(len(data)), b"")
        status, headers, body = request(url, "/files/blob/w.bin", headers={"Range": "bytes=1000-1999"})
        assert (status, body, headers["content-range"]) == (206, data[1000:2000], f"bytes 1000-1999/{len(data)}")
        status, _, body = request(url, "/files/blob/w.bin", headers={"Range": "bytes=-10"})
        assert (status, body) == (206, data[-10:])
        status, headers, body = request(url, "/files/blob/w.bin", headers={"Range": f"bytes={len(data)}-"})
        assert status == 416 and headers["content-range"] == f"bytes */{len(data)}"
        assert "outside the file" in json.loads(body)["error"]
        status, _, body = request(url, "/files/blob/sub/x.txt")
        assert (status, body) == (200, b"hello")
        status, _, body = request(url, "/api/files/blob")
        assert json.loads(body)["files"] == [{"path": "sub/x.txt", "size": 5}, {"path": "w.bin", "size": len(data)}]
        status, _, body = request(url, "/files/blob/missing.bin")
        assert status == 404 and "no file" in json.loads(body)["error"]


def test_path_traversal_refused(tmp_path: Path) -> None:
    """'..', encoded '..', absolute and symlinked-out paths are refused with a sentence; nothing outside leaks."""
    root = tmp_path / "m"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"SECRET")
    hfrepo.write_files(root, "blob", {"a.bin": b"a"})
    sha = hfrepo.write_repo(root, REPO, {"config.json": b"{}"})
    (root / "files" / "blob" / "out").symlink_to(secret)
    (root / "files" / "leak").symlink_to(tmp_path)
    (root / "hf" / "org" / "tiny" / sha / "out.json").symlink_to(secret)
    with running_mirror(tmp_path, root) as url:
        for path in ["/files/blob/../../secret.txt", "/files/blob/%2e%2e/%2e%2e/secret.txt", "/files/../secret.txt",
                     "/files/blob//etc/passwd", "/org/tiny/resolve/main/../../../../secret.txt",
                     "/org/tiny/resolve/main/%2e%2e/%2e%2e/%2e%2e/%2e%2e/secret.txt", "/files/blob/sub%5c..%5cx"]:
            status, _, body = request(url, path)
            # Refused for its text (400), before any filesystem look-up could follow it.
            assert status == 400, (path, status, body)
            assert b"SECRET" not in body
            said = json.loads(body)["error"]
            assert any(w in said for w in ("'..' segment", "backslash", "absolute", "not a name")), said
        status, _, body = request(url, "/api/models/org/../../secret.txt/revision/main")
        assert status in (400, 404) and b"SECRET" not in body and json.loads(body)["error"]
        for path in ["/files/blob/out", "/files/leak/secret.txt"]:
            status, _, body = request(url, path)
            assert status == 404 and b"outside the mirror" in body, (path, body)
        status, _, body = request(url, "/api/models/org/tiny")
        assert [s["rfilename"] for s in json.loads(body)["siblings"]] == ["config.json"]   # the link is not listed
        assert request(url, f"/org/tiny/resolve/{sha}/out.json")[0] == 404


def test_snapshot_download_gets_the_mirror_bytes(tmp_path: Path) -> None:
    """huggingface_hub's snapshot_download and hf_hub_download, pointed at the mirror, get byte-identical files."""
    root = tmp_path / "m"
    files = hfrepo.sample_files(seed=1)
    sha = hfrepo.write_repo(root, REPO, files)
    with running_mirror(tmp_path, root) as url:
        got = hf_client(tmp_path, url, "snapshot")
        assert got["errors"] == []
        local, cached = map(Path, got["results"])
        same_tree(local, files)
        same_tree(cached, files)
        assert cached.name == sha
        got = hf_client(tmp_path, url, "file")
        assert got["errors"] == []
        assert Path(got["results"][0]).read_bytes() == files["config.json"]
        assert Path(got["results"][1]).read_bytes() == files["model-00002-of-00002.safetensors"]
        status, headers, _ = request(url, "/org/tiny/resolve/main/config.json", method="HEAD")
        assert headers["x-repo-commit"] == sha and not any(h.startswith("x-xet") for h in headers)
        status, headers, _ = request(url, "/org/tiny/resolve/nope/config.json", method="HEAD")
        assert (status, headers["x-error-code"]) == (404, "RevisionNotFound")
        status, headers, _ = request(url, "/org/tiny/resolve/main/nope.json", method="HEAD")
        assert (status, headers["x-error-code"], headers["x-repo-commit"]) == (404, "EntryNotFound", sha)


def test_pull_through_fetches_each_file_once(tmp_path: Path) -> None:
    """4 clients at once through a pull-through mirror: 1 upstream fetch per file, and identical bytes for all."""
    hub_root = tmp_path / "hub"
    files = hfrepo.sample_files(seed=2, shard_bytes=8 << 20)
    hfrepo.write_repo(hub_root, REPO, files)
    with running_mirror(tmp_path, hub_root) as hub, \
            running_mirror(tmp_path, tmp_path / "edge", upstream=hub) as edge:
        got = hf_client(tmp_path, edge, "snapshot", clients=4)
        assert got["errors"] == []
        assert len(got["results"]) == 8
        for path in got["results"]:
            same_tree(Path(path), files)
        counted = stats(edge)
        assert sorted(k.split("/", 2)[2] for k in counted["files"]) == sorted(files)
        assert set(counted["files"].values()) == {1}
        same_tree(next((tmp_path / "edge" / "hf" / "org" / "tiny").glob("[0-9a-f]" * 40)), files)
        assert list((tmp_path / "edge" / ".partial").iterdir()) == []
        hf_client(tmp_path, edge, "file")   # served from the edge's disk now
        assert stats(edge)["file_fetches"] == len(files)


def test_pull_through_discards_a_corrupt_file(tmp_path: Path) -> None:
    """A file whose bytes do not match the upstream's sha256 is discarded, never placed, and the client fails."""
    hub_root = tmp_path / "hub"
    files = hfrepo.sample_files(seed=3)
    sha = hfrepo.write_repo(hub_root, REPO, files)
    with running_mirror(tmp_path, hub_root) as hub:
        request(hub, "/api/models/org/tiny")   # the hub hashes its files now and caches the hashes
        shard = hub_root / "hf" / "org" / "tiny" / sha / "model-00001-of-00002.safetensors"
        st = shard.stat()
        shard.write_bytes(b"\0" * st.st_size)   # same size and mtime: the hub keeps listing the old sha256
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        with running_mirror(tmp_path, tmp_path / "edge", upstream=hub) as edge:
            status, _, body = request(edge, "/org/tiny/resolve/main/model-00001-of-00002.safetensors")
            assert len(body) < st.st_size or status != 200
            assert not (tmp_path / "edge" / "hf" / "org" / "tiny" / sha / "model-00001-of-00002.safetensors").exists()
            assert list((tmp_path / "edge" / ".partial").iterdir()) == []
            status, _, body = request(edge, "/org/tiny/resolve/main/config.json")
            assert (status, body) == (200, files["config.json"])


def test_admin_add_needs_the_token(tmp_path: Path) -> None:
    """/admin/add is refused when off, with no or a wrong token; `llmgw mirror add` with the right one pre-loads."""
    hub_root = tmp_path / "hub"
    files = hfrepo.sample_files(seed=4)
    hfrepo.write_repo(hub_root, REPO, files)
    body = json.dumps({"source": "hf://org/tiny@main"})
    with running_mirror(tmp_path, hub_root) as hub:
        with running_mirror(tmp_path, tmp_path / "off", upstream=hub) as off:
            status, _, said = request(off, "/admin/add", method="POST", headers={"Authorization": "Bearer x"})
            assert status == 403 and b"--admin-token-file" in said
        with running_mirror(tmp_path, tmp_path / "edge", upstream=hub, token="s3cret") as edge:
            for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                conn = http.client.HTTPConnection("127.0.0.1", int(edge.rsplit(":", 1)[1]), timeout=30)
                conn.request("POST", "/admin/add", body=body, headers={"Content-Type": "application/json", **auth})
                r = conn.getresponse()
                assert r.status == 401 and b"admin token" in r.read(), auth
                conn.close()
            assert stats(edge, token="s3cret")["file_fetches"] == 0
            env = {k: v for k, v in os.environ.items() if k != "LLMGW_MIRROR_ADMIN_TOKEN"}
            cli = [sys.executable, "-m", "llmgw", "mirror", "add", "hf://org/tiny", "--mirror", edge]
            wrong = subprocess.run(cli, env={**env, "LLMGW_MIRROR_ADMIN_TOKEN": "nope"}, capture_output=True,
                                   text=True, timeout=60, check=False)
            assert wrong.returncode == 1 and "401" in wrong.stderr
            right = subprocess.run(cli, env={**env, "LLMGW_MIRROR_ADMIN_TOKEN": "s3cret"}, capture_output=True,
                                   text=True, timeout=60, check=False)
            assert right.returncode == 0, right.stderr
            assert f"{len(files)} fetched" in right.stdout
            assert stats(edge, token="s3cret")["file_fetches"] == len(files)
            got = hf_client(tmp_path, edge, "snapshot")
            assert got["errors"] == []
            same_tree(Path(got["results"][0]), files)
            assert stats(edge, token="s3cret")["file_fetches"] == len(files)   # all served from the edge's disk


def test_pull_through_answers_a_range_and_head_before_the_file_is_here(tmp_path: Path) -> None:
    """HEAD of a file the edge lacks gives the upstream's size and sha256 without fetching; a Range GET gets 206."""
    hub_root = tmp_path / "hub"
    files = hfrepo.sample_files(seed=6, shard_bytes=4 << 20)
    sha = hfrepo.write_repo(hub_root, REPO, files)
    name = "model-00001-of-00002.safetensors"
    data = files[name]
    with running_mirror(tmp_path, hub_root) as hub, \
            running_mirror(tmp_path, tmp_path / "edge", upstream=hub) as edge:
        status, headers, _ = request(edge, f"/org/tiny/resolve/main/{name}", method="HEAD")
        assert (status, headers["content-length"], headers["x-repo-commit"]) == (200, str(len(data)), sha)
        assert headers["x-linked-etag"].strip('"') == hashlib.sha256(data).hexdigest()
        assert stats(edge)["file_fetches"] == 0
        status, headers, body = request(edge, f"/org/tiny/resolve/{sha}/{name}", headers={"Range": "bytes=1000-"})
        assert (status, body) == (206, data[1000:])
        assert headers["content-range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
        assert (tmp_path / "edge" / "hf" / "org" / "tiny" / sha / name).read_bytes() == data
        status, _, body = request(edge, f"/org/tiny/resolve/main/{name}", headers={"Range": f"bytes={len(data)}-"})
        assert status == 416
        assert stats(edge)["file_fetches"] == 1
