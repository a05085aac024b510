"""The fabric test's pure parts: reading ib_write_bw's output, choosing the port, the verdict, the plan.

The outputs are real ones (tests/fixtures/perftest, each with its source on its
first line); the adapters are the captured sysfs tree under tests/fixtures/sysfs.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from llmgw.agent import fabric
from llmgw.agent.discovery import ib
from llmgw.control import fabric as control_fabric
from llmgw.control.agentsvc import link as agentsvc_link
from llmgw.control.state import NodeView
from llmgw.core import fabrictest as ft
from llmgw.core.inventory import Inventory

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PERFTEST = FIXTURES / "perftest"
SYSFS = FIXTURES / "sysfs" / "class" / "infiniband"
HCAS = ib.read_hcas(root=SYSFS)


def output(name: str) -> list[str]:
    """A fixture's lines, without its source line."""
    return [s for s in (PERFTEST / name).read_text().splitlines() if not s.startswith("# source:")]


def test_the_average_is_read_from_the_row_under_its_header_past_a_warning() -> None:
    """98.02 Gb/s from the real client output, whose CPU frequency warning sits between header and row."""
    assert fabric.average_gbps(output("ib_write_bw-client.txt")) == 98.02
    assert fabric.average_gbps(output("ib_write_bw-server.txt")) is None
    assert fabric.average_gbps(output("ib_write_bw-client-no-server.txt")) is None


def test_mb_per_second_is_converted_and_the_last_row_of_a_sweep_is_taken() -> None:
    """A run without --report_gbits (MB/sec) reads as Gb/s; with -a the largest message's row counts."""
    mb = [" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]",
          " 65536      5000             11730.00              11728.47           0.187"]
    assert fabric.average_gbps(mb) == pytest.approx(93.82776)
    sweep = [" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]",
             " 2          5000           0.042350            0.042185            2.636533",
             " 8388608    5000             390.11             389.70              0.005807"]
    assert fabric.average_gbps(sweep) == 389.70


def test_the_tool_s_failures_become_words_that_say_what_to_do() -> None:
    """"Couldn't connect" reads as no route with the address; "Port number 2 state is DOWN" as the port."""
    choice = ft.PortChoice("mlx5_1", 2, 40.0, "Ethernet", -1)
    said = fabric.failure_words(output("ib_write_bw-client-no-server.txt"), exit_code=1, choice=choice)
    assert said.startswith("no route to the server: could not connect to 192.168.125.211:18515")
    assert "TCP port 18515" in said
    said = fabric.failure_words(output("ib_write_bw-port-down.txt"), exit_code=1, choice=choice)
    assert said.startswith("port 2 of mlx5_1 is DOWN")
    assert fabric.failure_words(["something else broke"], exit_code=3, choice=choice) == \
        "ib_write_bw exited with code 3: something else broke"


def test_the_port_is_the_named_one_or_the_first_active_and_a_down_port_is_refused() -> None:
    """Defaults to mlx5_0 port 1 (400 Gb/s IB); mlx5_1 port 2 is refused as DOWN, an unknown adapter by name."""
    first = ft.choose_port("node1", HCAS)
    assert isinstance(first, ft.PortChoice)
    assert (first.hca, first.port, first.rate_gbps, first.roce) == ("mlx5_0", 1, 400.0, False)
    roce = ft.choose_port("node1", HCAS, hca="mlx5_1")
    assert isinstance(roce, ft.PortChoice) and (roce.port, roce.gid_index, roce.roce) == (1, 3, True)
    down = ft.choose_port("node1", HCAS, hca="mlx5_1", port=2)
    assert isinstance(down, str) and down.startswith("port 2 of mlx5_1 on node node1 is DOWN, physical state Disabled")
    missing = ft.choose_port("node1", HCAS, hca="mlx5_9")
    assert missing == "node node1 has no adapter mlx5_9; it has mlx5_0, mlx5_1: pick one of those with --hca"
    assert isinstance(ft.choose_port("node1", ()), str)


def test_the_verdict_is_the_share_of_the_port_rate_and_a_low_one_says_where_to_look() -> None:
    """376 of 400 Gb/s is "94% of 400 Gb/s"; 100 of 400 adds what to check."""
    assert ft.verdict(376.0, 400.0) == (94, "94% of 400 Gb/s")
    percent, said = ft.verdict(100.0, 400.0)
    assert percent == 25 and said.startswith("25% of 400 Gb/s: below 80%")


def test_argv_passes_the_roce_gid_index_and_the_client_names_its_server() -> None:
    """RoCE adds -x with the port's v2 GID index; the client ends with the server's address; argv, no shell."""
    req = ft.FabricTestRequest("t1", ft.CLIENT, tcp_port=20000, peer_addr="10.0.0.2", size_bytes=1 << 20,
                               duration_s=3)
    roce = ft.PortChoice("mlx5_1", 1, 100.0, "Ethernet", 3)
    assert fabric.argv("/usr/bin/ib_write_bw", req, roce) == [
        "/usr/bin/ib_write_bw", "-d", "mlx5_1", "-i", "1", "-s", "1048576", "-D", "3", "--report_gbits",
        "-p", "20000", "-x", "3", "10.0.0.2"]
    ib_port = ft.PortChoice("mlx5_0", 1, 400.0, "InfiniBand", -1)
    server = ft.FabricTestRequest("t1", ft.SERVER)
    assert "-x" not in fabric.argv("ib_write_bw", server, ib_port)
    assert fabric.argv("ib_write_bw", server, ib_port)[-1] == str(ft.DEFAULT_TCP_PORT)


def _node(node_id: str, *, addr: str = "10.0.0.1") -> NodeView:
    inv = Inventory(cpu_count=8, memory_total_bytes=1 << 34, memory_available_bytes=1 << 33, hcas=HCAS)
    return NodeView(node_id, inv, connected=True, mgmt_addr=addr)


def test_the_plan_sends_the_client_to_the_server_s_address_and_refuses_before_anything_runs() -> None:
    """Client peer is A's address; a down port, a node not connected, or one node twice are refused with a status."""
    nodes = {"a": _node("a", addr="10.0.0.1"), "b": _node("b", addr="10.0.0.2")}
    p = control_fabric.plan(nodes, {"a", "b"}, node_a="a", node_b="b", hca="mlx5_1", test_id="t9")
    assert (p.server.role, p.client.role, p.client.peer_addr, p.server.gid_index) == ("server", "client", "10.0.0.1", 3)
    assert p.rate_gbps == 100.0 and p.server.test_id == p.client.test_id == "t9"
    cases = [({"a", "b"}, {"node_a": "a", "node_b": "b", "hca": "mlx5_1", "port": 2}, 409, "is DOWN"),
             ({"a"}, {"node_a": "a", "node_b": "b"}, 409, "node b is not connected now"),
             ({"a", "b"}, {"node_a": "a", "node_b": "a"}, 400, "both ends are node a"),
             ({"a", "b"}, {"node_a": "a", "node_b": "zz"}, 404, "no node 'zz'")]
    for connected, kw, status, words in cases:
        with pytest.raises(control_fabric.FabricTestRefused) as e:
            control_fabric.plan(nodes, connected, **kw)  # type: ignore[arg-type]
        assert e.value.status == status and words in e.value.message


def test_the_report_gives_the_verdict_or_the_side_that_failed_first() -> None:
    """OK: "98% of 100 Gb/s"; a server that failed first is the reason, the client not awaited is not blamed."""
    nodes = {"a": _node("a"), "b": _node("b")}
    p = control_fabric.plan(nodes, {"a", "b"}, node_a="a", node_b="b", hca="mlx5_1", test_id="t1")
    ok = control_fabric.report(p, node_a="a", node_b="b", server=ft.FabricTestResult("t1", "server", True),
                               client=ft.FabricTestResult("t1", "client", True, gbps=98.02, port_rate_gbps=100.0))
    assert (ok["ok"], ok["percent"], ok["verdict"], ok["error"]) == (True, 98, "98% of 100 Gb/s", "")
    failed = control_fabric.report(p, node_a="a", node_b="b", client=None,
                                   server=ft.FabricTestResult("t1", "server", False, error="ib_write_bw is missing"))
    assert failed["ok"] is False and failed["error"] == "a (server): ib_write_bw is missing"
    silent = control_fabric.report(p, node_a="a", node_b="b", server=None, client=None)
    assert "did not answer within the test's deadline" in silent["error"]


def test_the_agent_refuses_a_port_sysfs_says_is_down_before_running_anything(tmp_path: Path) -> None:
    """The port went down after the heartbeat: the agent's own sysfs check refuses; the tool is never run."""
    root = tmp_path / "infiniband"
    shutil.copytree(SYSFS, root)
    (root / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    ran: list[str] = []

    def which(name: str) -> str | None:
        ran.append(name)
        return str(tmp_path / "no-such-ib_write_bw")  # were it run, the error would be "No such file"

    runner = fabric.Runner(node_id="node1", sysfs_root=root, which=which)
    req = ft.FabricTestRequest("t1", ft.SERVER, hca="mlx5_0", hca_port=1)
    result = asyncio.run(runner.run(req))
    assert not result.ok and result.error.startswith("port 1 of mlx5_0 on node node1 is DOWN")
    assert ran == ["ib_write_bw"]


def test_a_missing_tool_is_reported_with_the_command_that_installs_it(tmp_path: Path) -> None:
    """Not root: "ib_write_bw is not installed ... run `sudo apt-get install -y perftest`", nothing installed."""
    def which(name: str) -> str | None:
        return "/usr/bin/apt-get" if name == "apt-get" else None

    runner = fabric.Runner(node_id="node2", sysfs_root=SYSFS, which=which, euid=lambda: 1000, install=True)
    result = asyncio.run(runner.run(ft.FabricTestRequest("t1", ft.CLIENT, peer_addr="10.0.0.1")))
    assert not result.ok
    assert result.error == ("ib_write_bw is not installed on node node2 (not on the agent's PATH) and the agent "
                            "does not run as root: run `sudo apt-get install -y perftest` on that node, then test "
                            "again")
    assert fabric.install_command(which=lambda n: "/usr/bin/dnf" if n == "dnf" else None) == \
        ["dnf", "install", "-y", "perftest"]


def test_a_client_that_measured_nothing_is_not_a_silent_failure() -> None:
    """Both sides ended well but the client's row says 0 Gb/s: not ok, and the answer says why."""
    nodes = {"a": _node("a"), "b": _node("b")}
    p = control_fabric.plan(nodes, {"a", "b"}, node_a="a", node_b="b", test_id="t1")
    doc = control_fabric.report(p, node_a="a", node_b="b", server=ft.FabricTestResult("t1", "server", True),
                                client=ft.FabricTestResult("t1", "client", True, gbps=0.0))
    assert doc["ok"] is False and doc["error"].startswith("b (client): ib_write_bw ended without measuring anything")


def test_a_stream_that_ends_answers_the_test_sides_still_waiting_on_it() -> None:
    """The control plane's wait ends with "node X disconnected during the test", not at the deadline."""
    async def scenario() -> ft.FabricTestResult:
        link = agentsvc_link.Link("node2")
        fut = link.fabric_test(ft.FabricTestRequest("t7", ft.CLIENT, peer_addr="10.0.0.1"))
        sent = link.queue.get_nowait()
        assert sent is not None and sent.fabric_test.test_id == "t7" and sent.fabric_test.role == "client"
        link.end_fabric_tests()
        return await asyncio.wait_for(fut, 1)

    result = asyncio.run(scenario())
    assert not result.ok and result.error.startswith("node node2 disconnected during the test")
