"""One side of a fabric bandwidth test: perftest's ``ib_write_bw``, checked, run, watched and read.

This module owns the tool (one object per outside thing): ``Runner.run`` takes
a FabricTestRequest and always answers a FabricTestResult, never an exception,
so the control plane waiting on the other end learns why a side failed in
words, not by a timeout.

Before running, the port is read again from sysfs: the control plane refused a
port its last heartbeat saw down, but a link can drop in between, and the tool
itself only says "Port number 2 state is DOWN" after seconds of opening the
device. A client that cannot reach its server yet tries again for
``fabrictest.CONNECT_WAIT_S``: both sides are asked at once over two streams,
and the client's agent may be first. Every run has a deadline
(``FabricTestRequest.timeout_s``); a tool still running then is killed by its
pid, because a peer that vanished mid-test leaves ``ib_write_bw`` waiting on
its socket forever.

One test at a time: two tests on one adapter measure each other, and a second
server could not bind the first one's TCP port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from llmgw.agent.discovery import ib
from llmgw.core import fabrictest as ft

log = logging.getLogger(__name__)

TOOL = "ib_write_bw"
PACKAGE = "perftest"  # the same name in Debian/Ubuntu and RHEL/Fedora
_OUTPUT_KEEP = 60
_RETRY_EVERY_S = 0.5
_CONNECT_FAILED = re.compile(r"Couldn't connect to (\S+?):(\d+)")
_PORT_STATE = re.compile(r"Port number (\d+) state is (\S+)")


def install_command(*, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The command that installs perftest with this machine's package manager (apt-get, else dnf, else yum)."""
    for manager in ("apt-get", "dnf", "yum"):
        if which(manager):
            return [manager, "install", "-y", PACKAGE]
    return ["apt-get", "install", "-y", PACKAGE]


def argv(tool: str, req: ft.FabricTestRequest, choice: ft.PortChoice) -> list[str]:
    """The tool's argv for this side: a list, never a shell line."""
    out = [tool, "-d", choice.hca, "-i", str(choice.port), "-s", str(req.size_bytes), "-D", str(req.duration_s),
           "--report_gbits", "-p", str(req.tcp_port)]
    gid = req.gid_index if req.gid_index >= 0 else choice.gid_index
    if choice.roce and gid >= 0:
        # RoCE needs the v2 IPv4 GID: the default (0, link-local v1) does not cross an IP router.
        out += ["-x", str(gid)]
    if req.role == ft.CLIENT:
        out.append(req.peer_addr)
    return out


def average_gbps(lines: Iterable[str]) -> float | None:
    """The BW average of the last result row, in Gb/s; None when the output has none.

    The row is found under its header, not by position: perftest prints warnings
    between the two ("Conflicting CPU frequency values detected"). A header in
    MB/sec (a run without --report_gbits) is converted.
    """
    column, scale, found = -1, 1.0, None
    for line in lines:
        if "BW average[" in line:
            names = re.findall(r"#?[A-Za-z%.0-9]+(?: [a-z]+)?\[[^\]]*\]|#\w+", line)
            column = next((i for i, n in enumerate(names) if n.startswith("BW average")), -1)
            scale = 8 / 1000 if "average[MB/sec]" in line else 1.0
            continue
        fields = line.split()
        if column >= 0 and len(fields) > column and fields[0].isdigit():
            with contextlib.suppress(ValueError):
                found = float(fields[column]) * scale
    return found


def failure_words(lines: Iterable[str], *, exit_code: int | None, choice: ft.PortChoice) -> str:
    """Why the tool failed, in words that say what to do, from the messages it printed."""
    text = list(lines)
    for line in text:
        if m := _CONNECT_FAILED.search(line):
            return (f"no route to the server: could not connect to {m.group(1)}:{m.group(2)} for "
                    f"{ft.CONNECT_WAIT_S:g} s (ib_write_bw: \"{line.strip()}\"); check that the server node's "
                    f"management address is reachable from this node and TCP port {m.group(2)} is not firewalled")
        if m := _PORT_STATE.search(line):
            return (f"port {m.group(1)} of {choice.hca} is {m.group(2)} (ib_write_bw: \"{line.strip()}\"); bring "
                    "the link up or pick another port with --hca/--port")
    last = next((s.strip() for s in reversed(text) if s.strip()), "")
    return f"ib_write_bw exited with code {exit_code}" + (f": {last}" if last else " and printed nothing")


class Runner:
    """Runs this node's side of fabric tests, one at a time."""

    def __init__(self, *, node_id: str, sysfs_root: Path = ib.ROOT, which: Callable[[str], str | None] = shutil.which,
                 euid: Callable[[], int] = os.geteuid, install: bool = False) -> None:
        self.node_id, self.sysfs_root, self._which, self._euid = node_id, sysfs_root, which, euid
        #: Install perftest when it is missing and the agent runs as root (off: it is reported, with the command).
        self.install = install
        self._running: str = ""

    async def run(self, req: ft.FabricTestRequest) -> ft.FabricTestResult:
        """Checks, runs and reads one side; every failure is a result with the reason."""
        if self._running:
            return self._failed(req, f"fabric test {self._running} is still running on node {self.node_id} (one "
                                f"at a time: two tests on one adapter measure each other); run this one after it")
        self._running = req.test_id
        try:
            return await self._run(req)
        except Exception as e:  # an unexpected failure is still an answer, or the control plane waits it out
            log.exception("fabric test %s (%s) failed", req.test_id, req.role)
            return self._failed(req, f"the agent failed running the test: {type(e).__name__}: {e}; see its log")
        finally:
            self._running = ""

    async def _run(self, req: ft.FabricTestRequest) -> ft.FabricTestResult:
        tool, missing = await self._tool()
        if missing:
            return self._failed(req, missing)
        hcas = await asyncio.to_thread(ib.read_hcas, root=self.sysfs_root)
        choice = ft.choose_port(self.node_id, hcas, hca=req.hca, port=req.hca_port)
        if isinstance(choice, str):
            return self._failed(req, choice)
        if choice.roce and req.gid_index < 0 and choice.gid_index < 0:
            netdev = next((p.netdev for h in hcas if h.name == choice.hca for p in h.ports if p.port == choice.port),
                          "") or "its network interface"
            return self._failed(req, f"{choice.hca} port {choice.port} is RoCE and has no RoCE v2 GID with an IPv4 "
                                f"address, which RoCE traffic between nodes needs: give {netdev} an IPv4 address",
                                rate=choice.rate_gbps)
        args = argv(tool, req, choice)
        log.info("fabric test %s: running %s side: %s", req.test_id, req.role, " ".join(args))
        deadline = time.monotonic() + req.timeout_s()
        connect_until = time.monotonic() + ft.CONNECT_WAIT_S
        while True:
            code, lines, timed_out = await self._once(args, deadline)
            if timed_out:
                return self._failed(req, f"{ft.TIMED_OUT} {req.timeout_s():g} s ({req.duration_s} s of test and "
                                    f"{ft.CONNECT_WAIT_S + ft.SETUP_S:g} s to connect and set up); ib_write_bw "
                                    f"was killed (pid {timed_out}); {self._hang_hint(req)}",
                                    rate=choice.rate_gbps, output=lines)
            retry = (req.role == ft.CLIENT and code != 0 and any(_CONNECT_FAILED.search(s) for s in lines)
                     and time.monotonic() + _RETRY_EVERY_S < min(connect_until, deadline))
            if not retry:
                break
            await asyncio.sleep(_RETRY_EVERY_S)
        gbps = average_gbps(lines)
        if code != 0:
            return self._failed(req, failure_words(lines, exit_code=code, choice=choice),
                                rate=choice.rate_gbps, output=lines)
        if req.role == ft.CLIENT and gbps is None:
            return self._failed(req, "ib_write_bw ended without a result line (no \"BW average\" row); its output "
                                "is below", rate=choice.rate_gbps, output=lines)
        return ft.FabricTestResult(req.test_id, req.role, True, gbps=gbps or 0.0, port_rate_gbps=choice.rate_gbps,
                                   output=tuple(lines[-_OUTPUT_KEEP:]))

    def _hang_hint(self, req: ft.FabricTestRequest) -> str:
        if req.role == ft.SERVER:
            return "no client connected or the transfer stalled; see the client node's answer"
        return "the server accepted but the transfer stalled: check the link on both nodes (ibstat) and the MTU"

    async def _tool(self) -> tuple[str, str]:
        """(the tool's path, "") or ("", why it is missing); installed first when allowed and root."""
        path = self._which(TOOL)
        if path:
            return path, ""
        cmd = install_command(which=self._which)
        if self.install and self._euid() == 0:
            log.info("%s is missing; installing %s: %s", TOOL, PACKAGE, " ".join(cmd))
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
            out, _ = await proc.communicate()
            if proc.returncode == 0 and (path := self._which(TOOL)):
                return path, ""
            tail = out.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return "", (f"{TOOL} is not installed on node {self.node_id} and `{' '.join(cmd)}` failed (exit "
                    f"{proc.returncode}: {tail[0]}); install {PACKAGE} there by hand")
        why = "the agent does not run as root" if self._euid() != 0 else "installing it is not enabled"
        return "", (f"{TOOL} is not installed on node {self.node_id} (not on the agent's PATH) and {why}: run "
                f"`sudo {' '.join(cmd)}` on that node, then test again")

    async def _once(self, args: list[str], deadline: float) -> tuple[int | None, list[str], int]:
        """(exit code, output lines, pid killed on timeout or 0)."""
        proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        lines: list[str] = []

        async def read() -> None:
            assert proc.stdout is not None
            async for raw in proc.stdout:
                lines.append(raw.decode(errors="replace").rstrip("\n"))
                del lines[:-_OUTPUT_KEEP * 4]

        reader = asyncio.create_task(read())
        try:
            await asyncio.wait_for(asyncio.shield(reader), max(0.0, deadline - time.monotonic()))
            return await proc.wait(), lines, 0
        except TimeoutError:
            log.warning("fabric test: %s (pid %d) still running at its deadline; killing it", args[0], proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            reader.cancel()
            return proc.returncode, lines, proc.pid
        finally:
            if proc.returncode is None:  # cancelled (the agent stopping): the tool must not outlive the wait
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def _failed(self, req: ft.FabricTestRequest, error: str, *, rate: float = 0.0,
                output: Iterable[str] = ()) -> ft.FabricTestResult:
        log.warning("fabric test %s (%s): %s", req.test_id, req.role, error)
        return ft.FabricTestResult(req.test_id, req.role, False, error=error, port_rate_gbps=rate,
                                   output=tuple(list(output)[-_OUTPUT_KEEP:]))
