"""The liveness settings: read from the file and the environment under their fixed names, refused when not positive."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent import config, settings, settingsload
from llmgw.agent.supervisor import liveness

BASE_ENV = {"XDG_STATE_HOME": "/xdg/state", "HOME": "/home/u", "LLMGW_AGENT_SERVER": "cp1"}


#: An agent that has not joined runs only --insecure against loopback (``config.identity``).
_UNJOINED = {"mgmt_addr": "127.0.0.1", "insecure": True, "servers": ["127.0.0.1:8081"]}


def _load(tmp_path: Path, text: str = "", **env: str) -> settings.AgentSettings:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return settingsload.load(path=path, env={**BASE_ENV, **env}, flags={})


def _problems(tmp_path: Path, text: str = "", **env: str) -> list[str]:
    with pytest.raises(settings.SettingsError) as e:
        _load(tmp_path, text, **env)
    return e.value.problems


def test_defaults_are_the_measured_ones_and_reach_the_supervisor_config(tmp_path: Path) -> None:
    """Unset, the three settings are liveness's defaults (2 s, 2 s, 3), and the agent config carries them whole."""
    s = _load(tmp_path)
    assert (s.probe_period_s, s.probe_timeout_s, s.probe_failure_threshold) == (2.0, 2.0, 3)
    cfg = config.from_settings(s.model_copy(update=_UNJOINED))
    assert cfg.probes == liveness.Liveness(period_s=2.0, timeout_s=2.0, failure_threshold=3)


def test_file_values_and_units_are_read(tmp_path: Path) -> None:
    """YAML keys probe_period_s, probe_timeout_s and probe_failure_threshold; a duration may carry a unit."""
    s = _load(tmp_path, "probe_period_s: 500ms\nprobe_timeout_s: 1.5\nprobe_failure_threshold: 5\n")
    assert (s.probe_period_s, s.probe_timeout_s, s.probe_failure_threshold) == (0.5, 1.5, 5)


def test_environment_names_are_the_ones_other_parts_set_and_win_over_the_file(tmp_path: Path) -> None:
    """LLMGW_AGENT_PROBE_PERIOD_S, _PROBE_TIMEOUT_S and _PROBE_FAILURE_THRESHOLD override the file."""
    s = _load(tmp_path, "probe_period_s: 9\nprobe_failure_threshold: 9\n", LLMGW_AGENT_PROBE_PERIOD_S="0.2",
              LLMGW_AGENT_PROBE_TIMEOUT_S="300ms", LLMGW_AGENT_PROBE_FAILURE_THRESHOLD="2")
    assert (s.probe_period_s, s.probe_timeout_s, s.probe_failure_threshold) == (0.2, 0.3, 2)
    cfg = config.from_settings(s.model_copy(update=_UNJOINED))
    assert cfg.probes == liveness.Liveness(period_s=0.2, timeout_s=0.3, failure_threshold=2)


def test_non_positive_values_are_refused_each_naming_its_source(tmp_path: Path) -> None:
    """0 s, a negative duration and a threshold of 0 are each one problem, said with the variable or file key."""
    problems = _problems(tmp_path, "probe_failure_threshold: 0\n", LLMGW_AGENT_PROBE_PERIOD_S="0",
                         LLMGW_AGENT_PROBE_TIMEOUT_S="-1")
    file = tmp_path / "agent.yaml"
    assert sorted(problems) == sorted([
        "LLMGW_AGENT_PROBE_PERIOD_S: must be more than 0s",
        "LLMGW_AGENT_PROBE_TIMEOUT_S: expected a duration such as 5s, got -1.0",
        f"{file}: probe_failure_threshold: must be at least 1 (the failed probes in a row that make a shard "
        "Unhealthy), got 0",
    ])


def test_a_threshold_that_is_not_a_whole_number_is_refused(tmp_path: Path) -> None:
    """`yes` (YAML's true) and 2.5 are not counts of probes; the message says what is expected."""
    file = tmp_path / "agent.yaml"
    assert _problems(tmp_path, "probe_failure_threshold: yes\n") == [
        f"{file}: probe_failure_threshold: expected a whole number of failed probes such as 3, got True"]
    [problem] = _problems(tmp_path, LLMGW_AGENT_PROBE_FAILURE_THRESHOLD="2.5")
    assert problem.startswith("LLMGW_AGENT_PROBE_FAILURE_THRESHOLD: ") and "integer" in problem
