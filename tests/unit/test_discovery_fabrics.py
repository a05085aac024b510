"""Declared fabrics against the adapters: what is advertised, what is said, and when."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from llmgw.agent.discovery import fabrics, ib
from llmgw.core.inventory import Fabric, Hca

SYSFS = Path(__file__).parent.parent / "fixtures" / "sysfs" / "class" / "infiniband"
LOGGER = "llmgw.agent.discovery.fabrics"


def hcas() -> tuple[Hca, ...]:
    return ib.read_hcas(root=SYSFS)


def down(hca: Hca) -> Hca:
    return dataclasses.replace(hca, ports=tuple(dataclasses.replace(p, state="DOWN", phys_state="Disabled")
                                                for p in hca.ports))


def test_usable_adapters_are_advertised_and_a_down_one_is_dropped_with_its_reason() -> None:
    """A fabric keeps its usable adapters; a RoCE adapter with one live port is usable."""
    found, problems = fabrics.assess([("ib-a", ["mlx5_0"]), ("roce", ["mlx5_1"])], hcas())
    assert found == (Fabric("ib-a", ("mlx5_0",)), Fabric("roce", ("mlx5_1",)))
    assert problems == ()
    found, problems = fabrics.assess([("ib-a", ["mlx5_0", "mlx5_1"])], (down(hcas()[0]), hcas()[1]))
    assert found == (Fabric("ib-a", ("mlx5_1",)),)
    assert problems == ("adapter mlx5_0 declared for fabric ib-a has no usable port: port 1 DOWN (Disabled)",)


def test_a_fabric_with_no_usable_adapter_is_not_advertised() -> None:
    """Missing and down adapters leave the fabric out, and the consequence is named."""
    found, problems = fabrics.assess([("ib-b", ["mlx5_7"]), ("ib-c", ["mlx5_0"])], (down(hcas()[0]),))
    assert found == ()
    assert problems[0] == ("adapter mlx5_7 declared for fabric ib-b does not exist on this node "
                           "(adapters here: mlx5_0)")
    assert "multi-node replicas on fabric ib-b will not be placed on this node" in problems[1]
    assert "mlx5_0 declared for fabric ib-c has no usable port: port 1 DOWN" in problems[2]
    assert "multi-node replicas on fabric ib-c will not be placed on this node" in problems[3]


def test_an_adapter_in_two_fabrics_is_a_problem() -> None:
    """One adapter is cabled to one fabric, so naming it twice is called out (and both keep it)."""
    found, problems = fabrics.assess([("a", ["mlx5_0"]), ("b", ["mlx5_0"])], hcas())
    assert [f.name for f in found] == ["a", "b"]
    assert problems == ("adapter mlx5_0 is declared in fabrics a, b; an adapter is cabled to one fabric, "
                        "so all but one of those declarations are wrong",)


def test_roce_without_a_v2_ipv4_gid_is_said() -> None:
    """A live RoCE port with no RoCE v2 IPv4 GID stays advertised, with a warning NCCL would need."""
    roce = hcas()[1]
    no_gid = dataclasses.replace(roce, ports=(dataclasses.replace(roce.ports[0], roce_v2_gid_index=-1),))
    found, problems = fabrics.assess([("roce", ["mlx5_1"])], (no_gid,))
    assert found == (Fabric("roce", ("mlx5_1",)),) and "RoCE v2 IPv4 GID" in problems[0]


def test_loud_logs_every_time_and_quiet_only_when_the_answer_changes(caplog: pytest.LogCaptureFixture) -> None:
    """Registration (loud) says the problem; heartbeats (quiet) are silent until a port comes back."""
    checker = fabrics.FabricChecker()
    declared = [("ib-a", ["mlx5_0"])]
    broken = (down(hcas()[0]),)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert checker.check(declared, broken, loud=True) == ()
        loud = len(caplog.records)
        for _ in range(3):
            assert checker.check(declared, broken, loud=False) == ()
        assert len(caplog.records) == loud == 2
        assert checker.check(declared, hcas(), loud=False) == (Fabric("ib-a", ("mlx5_0",)),)
    assert all(r.levelname == "WARNING" for r in caplog.records)
    assert caplog.records[-1].getMessage() == "the fabrics this node can carry traffic on changed; now ib-a: mlx5_0"
