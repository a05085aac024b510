"""A shard runs the install its model's engine_version names, not merely the newest one on the node."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from llmgw.agent import engines
from llmgw.api import convert
from llmgw.core.shards import ShardSpec


@pytest.fixture
def two_sims() -> Iterator[None]:
    engines.set_installed((engines.Installed("sim", "0.3.1", "/opt/e/sim-0.3.1-py/bin/python"),
                           engines.Installed("sim", "0.4.0", "/opt/e/sim-0.4.0-py/bin/python")))
    try:
        yield
    finally:
        engines.set_installed(())


SPEC = ShardSpec(shard_id="m-1", replica_id="m-r1", model="m", engine="sim", served_name="m")


def _runs(version: str = "") -> str:
    """The program the shard's engine process would be started with."""
    return engines.get("sim", version).launch(SPEC, host="127.0.0.1", port=1, model_path=None, cpu_count=1).argv[0]


def test_the_shards_engine_version_picks_the_install(two_sims: None) -> None:
    """engine_version 0.3 runs 0.3.1's python; none runs the newest; 0.4 the newest too."""
    assert _runs("0.3") == "/opt/e/sim-0.3.1-py/bin/python"
    assert _runs("0.3.1") == "/opt/e/sim-0.3.1-py/bin/python"
    assert _runs() == "/opt/e/sim-0.4.0-py/bin/python"
    assert _runs("0.4") == "/opt/e/sim-0.4.0-py/bin/python"


def test_engine_version_crosses_the_wire() -> None:
    """The control plane's ShardSpec.engine_version reaches the agent."""
    spec = dataclasses.replace(SPEC, engine_version="0.3")
    assert convert.spec_from_pb(convert.spec_to_pb(spec)).engine_version == "0.3"
