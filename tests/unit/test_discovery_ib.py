"""InfiniBand/RoCE from a sysfs tree, and subnet managers from sminfo/saquery output."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from llmgw.agent.discovery import ib, sm
from llmgw.core.inventory import Hca, HcaPort

FIXTURES = Path(__file__).parent.parent / "fixtures"
SYSFS = FIXTURES / "sysfs" / "class" / "infiniband"
MASTER = (FIXTURES / "ib" / "sminfo-master.txt").read_text()
FAILOVER = (FIXTURES / "ib" / "sminfo-failover.txt").read_text()
SMIR = (FIXTURES / "ib" / "saquery-smir.txt").read_text()


def test_fixture_tree_reads_an_ib_and_a_roce_adapter() -> None:
    """mlx5_0 is NDR InfiniBand, usable; mlx5_1 is RoCE, usable through port 1 while port 2 is down."""
    ib0, roce = ib.read_hcas(root=SYSFS)
    assert (ib0.name, ib0.node_guid, ib0.usable) == ("mlx5_0", "0xb83fd20300a1b2c4", True)
    (p,) = ib0.ports
    assert (p.state, p.phys_state, p.rate_gbps, p.link_layer) == ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert (p.port_guid, p.gid_prefix, p.roce_v2_gid_index, p.netdev) == (
        "0xb83fd20300a1b2c4", "0xfe80000000000000", -1, "ibp24s0")
    counters = dict(p.counters)
    assert counters["port_rcv_data"] == 918273645512 and counters["link_downed"] == 1
    up, down = roce.ports
    assert roce.usable and up.usable and not down.usable
    assert (up.link_layer, up.rate_gbps, up.roce_v2_gid_index, up.netdev) == ("Ethernet", 100.0, 3, "ens2f0np0")
    assert (down.state, down.phys_state, down.roce_v2_gid_index, down.netdev) == ("DOWN", "Disabled", -1, "ens2f1np1")


def test_missing_and_unreadable_files_read_as_defaults(tmp_path: Path) -> None:
    """A port with only a state file, and a counter that cannot be read, give defaults, not exceptions."""
    port = tmp_path / "mlx5_9" / "ports" / "1"
    (port / "counters" / "symbol_error").mkdir(parents=True)  # reading a directory fails like EINVAL would
    (port / "counters" / "link_downed").write_text("2\n")
    (port / "state").write_text("4: ACTIVE\n")
    (hca,) = ib.read_hcas(root=tmp_path)
    assert hca == Hca(name="mlx5_9", ports=(HcaPort(port=1, state="ACTIVE", counters=(("link_downed", 2),)),))
    assert hca.usable  # no phys_state file is not a reason to refuse the port
    assert ib.read_hcas(root=tmp_path / "absent") == ()


@pytest.mark.parametrize(("text", "gbps"), [("400 Gb/sec (4X NDR)\n", 400.0), ("56 Gb/sec (4X FDR)", 56.0),
                                            ("2.5 Gb/sec (1X SDR)", 2.5), ("", 0.0), ("garbage", 0.0)])
def test_rate_parsing(text: str, gbps: float) -> None:
    """The leading number of sysfs's rate, in Gb/s; anything else is 0."""
    assert ib._rate_gbps(text) == gbps


def test_guid_forms_are_one_spelling() -> None:
    """sysfs's colon form and sminfo's unpadded 0x form compare equal once normalised."""
    assert ib.guid("0002:c903:0010:b250") == ib.guid("0x2c9030010b250") == "0x0002c9030010b250"
    assert ib.guid("not-hex") == ""


def test_sminfo_and_smir_parsing() -> None:
    """sminfo's one line is the master; saquery SMIR's blocks are every SM, numeric states named."""
    master = sm.parse_sminfo(MASTER, via="mlx5_0/1")
    assert master is not None
    assert (master.lid, master.guid, master.priority, master.state, master.via) == (
        1, "0x98039b0300671234", 15, "MASTER", "mlx5_0/1")
    assert sm.parse_sminfo("sminfo: iberror: failed: query\n") is None
    assert [(s.lid, s.guid, s.priority, s.state) for s in sm.parse_smir(SMIR)] == [
        (1, "0x98039b0300671234", 15, "MASTER"), (7, "0x98039b03006755aa", 14, "STANDBY")]


class FakeTools:
    """Answers sminfo and saquery from fixture text, and records every argv."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.sminfo = MASTER

    def run(self, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        out = self.sminfo if argv[0].endswith("sminfo") else SMIR
        return subprocess.CompletedProcess(argv, 0 if out else 255, stdout=out,
                                           stderr="" if out else "sminfo: iberror: failed: query\n")


def ib_hcas() -> tuple[Hca, ...]:
    return ib.read_hcas(root=SYSFS)


def test_probe_asks_each_active_ib_port_once_a_minute_and_logs_a_failover(caplog: pytest.LogCaptureFixture) -> None:
    """Only mlx5_0/1 is asked (mlx5_1 is RoCE); the answer is reused for 60 s; a new master is a WARNING."""
    tools, now = FakeTools(), [0.0]
    probe = sm.SubnetManagerProbe(run=tools.run, clock=lambda: now[0], which=lambda n: f"/usr/sbin/{n}")
    first = probe.sample(ib_hcas())
    assert [(s.lid, s.state, s.via) for s in first] == [(1, "MASTER", "mlx5_0/1"), (7, "STANDBY", "mlx5_0/1")]
    assert tools.calls == [["/usr/sbin/sminfo", "-C", "mlx5_0", "-P", "1"],
                           ["/usr/sbin/saquery", "-C", "mlx5_0", "-P", "1", "SMIR"]]
    now[0] = 59.0
    assert probe.sample(ib_hcas()) == first and len(tools.calls) == 2
    tools.sminfo, now[0] = FAILOVER, 61.0
    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery.sm"):
        after = probe.sample(ib_hcas())
    assert after[0].lid == 7 and len(tools.calls) == 4
    (said,) = caplog.records
    assert said.getMessage() == ("subnet manager master changed from lid 1 guid 0x98039b0300671234 to "
                                 "lid 7 guid 0x98039b03006755aa (seen through mlx5_0/1)")


def test_probe_without_tools_or_ib_ports_runs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """No infiniband-diags: () and one INFO line; no active IB port: () and not even a lookup."""
    tools, looked = FakeTools(), []

    def missing(name: str) -> None:
        looked.append(name)

    probe = sm.SubnetManagerProbe(run=tools.run, which=missing)
    roce_only = tuple(h for h in ib_hcas() if h.name == "mlx5_1")
    assert probe.sample(roce_only) == () and looked == []
    with caplog.at_level(logging.INFO, logger="llmgw.agent.discovery.sm"):
        assert probe.sample(ib_hcas()) == () and probe.sample(ib_hcas()) == ()
    assert tools.calls == [] and len(caplog.records) == 1 and "not installed" in caplog.records[0].getMessage()


def test_probe_reports_a_port_whose_sm_does_not_answer(caplog: pytest.LogCaptureFixture) -> None:
    """A failing sminfo gives no SM for that port and a WARNING with the tool's last line, once."""
    tools, now = FakeTools(), [0.0]
    tools.sminfo = ""
    probe = sm.SubnetManagerProbe(run=tools.run, clock=lambda: now[0], which=lambda n: n)
    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery.sm"):
        assert probe.sample(ib_hcas()) == ()
        now[0] = 120.0
        assert probe.sample(ib_hcas()) == ()
    (said,) = caplog.records
    assert "mlx5_0/1" in said.getMessage() and "iberror: failed: query" in said.getMessage()


def test_tools_installed_while_running_are_found_within_an_interval() -> None:
    """infiniband-diags installed after start is looked for again a minute later, without a restart."""
    tools, now, installed = FakeTools(), [0.0], [False]
    probe = sm.SubnetManagerProbe(run=tools.run, clock=lambda: now[0],
                                  which=lambda n: n if installed[0] else None)
    assert probe.sample(ib_hcas()) == ()
    installed[0] = True
    now[0] = 30.0
    assert probe.sample(ib_hcas()) == ()
    now[0] = 60.0
    assert [s.lid for s in probe.sample(ib_hcas())] == [1, 7]
