"""`llmgw fabric test` end to end: a real server, two real agents (secure), a fake ib_write_bw on their PATH.

This machine has no RDMA adapter, so the agents read the captured sysfs tree
(tests/fixtures/sysfs: mlx5_0 port 1 InfiniBand 400 Gb/s ACTIVE, mlx5_1 port 1
RoCE 100 Gb/s ACTIVE with its v2 GID at index 3, mlx5_1 port 2 DOWN), and the
tool is a Python script this module writes: it opens a real TCP connection
between the two sides on the port it is given, as ib_write_bw exchanges its
connection data, and prints the real outputs under tests/fixtures/perftest.
A file beside it (``mode``) chooses a failure: ``noroute`` (the server never
listens, so the client's connect is refused and it prints perftest's words)
or ``hang`` (both sides connect and then never finish). Every run is written
to ``runs.jsonl`` (role, pid, argv), which is how the tests see the argv the
agents built and that a hung tool was killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from llmgw.testing.procs import free_port
from llmgw.testing.system import LLMGW, System

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SYSFS = FIXTURES / "sysfs" / "class" / "infiniband"

FAKE = r'''
import json, os, socket, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = {fixtures!r}


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return [s for s in f.read().splitlines() if not s.startswith("# source:")]


def out(lines):
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


args, opts, peers = sys.argv[1:], {{}}, []
i = 0
while i < len(args):
    if args[i] in ("-d", "-i", "-s", "-D", "-p", "-x"):
        opts[args[i]] = args[i + 1]
        i += 2
    else:
        (peers if not args[i].startswith("-") else []).append(args[i])
        i += 1
role = "client" if peers else "server"
mode_file = os.path.join(HERE, "mode")
mode = open(mode_file).read().strip() if os.path.exists(mode_file) else "ok"
with open(os.path.join(HERE, "runs.jsonl"), "a") as f:
    f.write(json.dumps({{"role": role, "pid": os.getpid(), "argv": args, "mode": mode}}) + "\n")
port = int(opts.get("-p", "18515"))
if role == "server":
    if mode == "noroute":
        time.sleep(120)  # never listens; the agent kills it at its deadline
        sys.exit(1)
    lines = fixture("ib_write_bw-server.txt")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    out(lines[:4])  # "* Waiting for client to connect... *"
    conn, _ = s.accept()
    if mode == "hang":
        time.sleep(300)
    conn.recv(1)
    out(lines[4:])
    sys.exit(0)
peer = peers[-1]
try:
    c = socket.create_connection((peer, port), timeout=5)
except OSError:
    # perftest's words, with this run's address and port in place of the fixture's.
    failed = fixture("ib_write_bw-client-no-server.txt")
    sys.stderr.write("\n".join(s.replace("192.168.125.211:18515", f"{{peer}}:{{port}}") for s in failed) + "\n")
    sys.exit(1)
if mode == "hang":
    time.sleep(300)
c.close()
out(fixture("ib_write_bw-client.txt"))
'''


class Fake:
    """The fake tool's directory: its script, its mode file and its record of runs."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "fakebin"
        self.dir.mkdir()
        self.tool = self.dir / "ib_write_bw"
        self.tool.write_text(f"#!{sys.executable}\n" + FAKE.format(fixtures=str(FIXTURES / "perftest")))
        self.tool.chmod(0o755)

    def mode(self, mode: str) -> None:
        (self.dir / "mode").write_text(mode)

    def runs(self) -> list[dict[str, Any]]:
        path = self.dir / "runs.jsonl"
        return [json.loads(s) for s in path.read_text().splitlines()] if path.exists() else []

    def kill_leftovers(self) -> None:
        """Ends any run still alive (an agent that stopped first leaves its tool), by its recorded pid."""
        for run in self.runs():
            try:
                p = psutil.Process(run["pid"])
                if self.tool.name in " ".join(p.cmdline()):
                    p.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass


def _path_without_real_tool() -> str:
    # A real perftest on this machine would be found after the fake is taken away.
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not (Path(d) / "ib_write_bw").exists())


@pytest.fixture(scope="module")
def fabric_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[System, Fake]]:
    root = tmp_path_factory.mktemp("fabric")
    fake = Fake(root)
    env = {"PATH": f"{fake.dir}{os.pathsep}{_path_without_real_tool()}",
           "LLMGW_AGENT_DISCOVERY__SYSFS_ROOT": str(SYSFS), "LLMGW_AGENT_DISCOVERY__PREFER_NVML": "false"}
    s = System(root, agent_env=env)
    try:
        s.start_server()
        s.start_agent("node1")
        s.start_agent("node2")
        yield s, fake
    finally:
        s.close()
        fake.kill_leftovers()


def fabric_test(s: System, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMGW, "fabric", "test", "node1", "node2", *args, "--url", s.url], capture_output=True,
                          text=True, timeout=timeout, env={**s.cli_env(), "COLUMNS": "400"})


def test_the_measured_bandwidth_is_shown_against_the_port_rate(fabric_system: tuple[System, Fake]) -> None:
    """98.02 Gb/s on RoCE mlx5_1 (100 Gb/s): "98% of 100 Gb/s"; server on node1, client to its address, GID 3."""
    s, fake = fabric_system
    fake.mode("ok")
    port = free_port()
    out = fabric_test(s, "--hca", "mlx5_1", "--size", "1M", "--duration", "2", "--tcp-port", str(port))
    assert out.returncode == 0, out.stderr
    assert "98.02 Gb/s, 98% of 100 Gb/s" in out.stdout
    assert out.stdout.startswith("node2 mlx5_1 port 1 (RoCE, 100 Gb/s, GID index 3) -> node1 mlx5_1 port 1 (RoCE, "
                                 "100 Gb/s, GID index 3), 1000000 B messages for 2 s: 98.02 Gb/s, 98% of 100 Gb/s")
    runs = fake.runs()
    server = next(r for r in runs if r["role"] == "server")
    clients = [r for r in runs if r["role"] == "client"]
    common = ["-d", "mlx5_1", "-i", "1", "-s", "1000000", "-D", "2", "--report_gbits", "-p", str(port), "-x", "3"]
    assert server["argv"] == common
    # The client may have tried before the server listened (its agent retries); its argv is the same each time.
    assert clients and all(c["argv"] == [*common, "127.0.0.1"] for c in clients)


def test_a_port_the_node_reports_down_is_refused_before_anything_runs(fabric_system: tuple[System, Fake]) -> None:
    """mlx5_1 port 2 is DOWN in node1's inventory: refused with why and what to do; the tool never ran."""
    s, fake = fabric_system
    before = len(fake.runs())
    out = fabric_test(s, "--hca", "mlx5_1", "--port", "2", "--tcp-port", str(free_port()))
    assert out.returncode == 1
    assert "port 2 of mlx5_1 on node node1 is DOWN, physical state Disabled" in out.stderr
    assert "bring the link up" in out.stderr
    assert len(fake.runs()) == before


def test_a_hung_tool_is_killed_by_pid_at_its_deadline(fabric_system: tuple[System, Fake]) -> None:
    """Both sides connect and never finish: each agent kills its tool at 1 + 15 s and says so."""
    s, fake = fabric_system
    fake.mode("hang")
    before = len(fake.runs())
    out = fabric_test(s, "--hca", "mlx5_0", "--duration", "1", "--tcp-port", str(free_port()))
    assert out.returncode == 1
    assert "timed out after 16 s" in out.stderr and "ib_write_bw was killed (pid" in out.stderr
    hung = fake.runs()[before:]
    assert {r["role"] for r in hung} == {"server", "client"}
    for role, node in (("server", "node1"), ("client", "node2")):
        last = [r for r in hung if r["role"] == role][-1]  # a client refused before the server listened retried
        assert f"{node} ({role}): timed out" in out.stderr and f"killed (pid {last['pid']})" in out.stderr
        assert not psutil.pid_exists(last["pid"])


def test_a_missing_tool_is_reported_with_the_command_that_installs_it(fabric_system: tuple[System, Fake]) -> None:
    """No ib_write_bw on the agent's PATH (and not root): the answer names the install command."""
    s, fake = fabric_system
    hidden = fake.dir / "ib_write_bw.hidden"
    fake.tool.rename(hidden)
    try:
        out = fabric_test(s, "--tcp-port", str(free_port()))
    finally:
        hidden.rename(fake.tool)
    assert out.returncode == 1
    assert "ib_write_bw is not installed on node node1 (not on the agent's PATH)" in out.stderr
    assert "install -y perftest` on that node" in out.stderr


def test_no_route_to_the_server_is_said_with_the_address(fabric_system: tuple[System, Fake]) -> None:
    """The server never listens: the client's connect is refused for its whole wait; reported as no route."""
    s, fake = fabric_system
    fake.mode("noroute")
    port = free_port()
    out = fabric_test(s, "--duration", "1", "--tcp-port", str(port))
    assert out.returncode == 1
    assert f"node2 (client): no route to the server: could not connect to 127.0.0.1:{port} for 5 s" in out.stderr
    assert f"Couldn't connect to 127.0.0.1:{port}" in out.stderr  # the tool's own words, in its output
