"""``llmgw version``'s rows: the CLI, each control plane, each agent; a version other than the control plane's
is marked, so a skew shows (issue 29's first part: one version in one place, said by every part)."""

from __future__ import annotations

from llmgw.cli import version as version_cmd
from llmgw.core import version


def test_the_version_is_the_installed_packages() -> None:
    import importlib.metadata

    assert version.version() == importlib.metadata.version("llmgw")


def test_a_part_at_another_version_than_the_control_plane_is_marked() -> None:
    cps = {"controlplanes": [{"id": "cp-a", "role": "standby", "version": "0.2.0"},
                             {"id": "cp-b", "role": "leader", "version": "0.3.0"}]}
    nodes = [{"id": "n1", "agent_version": "0.3.0"}, {"id": "n2", "agent_version": "0.2.0"},
             {"id": "n3", "agent_version": ""}]
    rows = version_cmd.lines("0.3.0", cps, nodes)
    assert rows[0].split() == ["cli", "0.3.0"]
    marked = [r for r in rows if "differs" in r]
    # The leader's version is the reference: the standby and n2 differ; n3 said none.
    assert [r.split()[:3] for r in marked] == [["control", "plane", "cp-a"], ["agent", "n2", "0.2.0"]]
    assert all("(differs from the control plane's 0.3.0)" in r for r in marked)
    assert any(r.split() == ["agent", "n3", "-"] for r in rows)


def test_without_a_control_plane_only_the_cli_is_said() -> None:
    assert [r.split() for r in version_cmd.lines("0.3.0", None, None)] == [["cli", "0.3.0"]]


def test_each_router_is_listed_and_one_at_another_version_marked() -> None:
    cps = {"controlplanes": [{"id": "cp-a", "role": "leader", "version": "0.3.0"}]}
    routers = [{"id": "edge1", "version": "0.3.0", "protocol": 3}, {"id": "edge2", "version": "0.2.0", "protocol": 2},
               {"id": "old", "version": "", "protocol": 0}]
    rows = version_cmd.lines("0.3.0", cps, [], routers)
    assert [r.split()[:3] for r in rows if r.startswith("router")] == [["router", "edge1", "0.3.0"],
                                                                        ["router", "edge2", "0.2.0"],
                                                                        ["router", "old", "-"]]
    assert [r.split()[1] for r in rows if "differs" in r] == ["edge2"]
