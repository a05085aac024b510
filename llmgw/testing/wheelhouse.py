"""A wheelhouse for engine-install tests: the sim engine packaged as a wheel, and what pip fetched beside it.

The sim's wheel is written here directly (a wheel is a zip with METADATA, WHEEL and RECORD), so no build
backend runs: the package ``llmgw_sim_engine`` is llmgw/sim/engine/ as it is, and the wheel requires aiohttp, the
one package it imports. ``fill`` adds the other wheels with ``pip download`` through the machine's
ordinary pip setup (its cache makes a second run take about a second); the agent under test then installs
from this directory only, served on 127.0.0.1 as a flat ``--find-links`` page.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from llmgw.testing.procs import Proc, free_port

SIM_SOURCE = Path(__file__).resolve().parent.parent / "sim" / "engine"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_sim_wheel(out_dir: Path, version: str) -> Path:
    """``llmgw_sim_engine-VERSION-py3-none-any.whl`` in ``out_dir``; ``python -m llmgw_sim_engine`` runs the sim."""
    dist = f"llmgw_sim_engine-{version}.dist-info"
    files = {f"llmgw_sim_engine/{p.name}": p.read_bytes() for p in sorted(SIM_SOURCE.glob("*.py"))}
    files |= {
        f"{dist}/METADATA": (f"Metadata-Version: 2.1\nName: llmgw-sim-engine\nVersion: {version}\n"
                             "Summary: llmgw's simulated engine, packaged for install tests\n"
                             "Requires-Dist: aiohttp>=3.10\n").encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: llmgw.testing.wheelhouse\nRoot-Is-Purelib: true\n"
                         b"Tag: py3-none-any\n",
    }
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist}/RECORD"] = (record + f"{dist}/RECORD,,\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"llmgw_sim_engine-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def download(out_dir: Path, *requirements: str, deps: bool = True) -> None:
    """``pip download`` into ``out_dir`` through this machine's pip configuration (the registry and its cache)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(out_dir),
                    *([] if deps else ["--no-deps"]), *requirements], check=True, stdin=subprocess.DEVNULL)


def fill(out_dir: Path, *, sim_versions: tuple[str, ...] = ("0.3.1",), xllamacpp: bool = True) -> Path:
    """The sim's wheels, aiohttp with its dependencies and (when asked) xllamacpp, at the versions installed here."""
    for v in sim_versions:
        build_sim_wheel(out_dir, v)
    download(out_dir, f"aiohttp=={importlib.metadata.version('aiohttp')}")
    if xllamacpp:
        download(out_dir, f"xllamacpp=={importlib.metadata.version('xllamacpp')}", deps=False)
    return out_dir


@contextlib.contextmanager
def serve(directory: Path, *, log_path: Path) -> Iterator[str]:
    """``directory`` as a flat ``--find-links`` page on 127.0.0.1 (http.server, stopped by pid); yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with Proc.start([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(directory),
                     str(port)], log_path=log_path) as server:
        server.wait_http(url, timeout=20)
        yield url
