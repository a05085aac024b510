"""The agent's settings: precedence of flags, environment and file; every error naming its source; found defaults."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from llmgw.agent import settings, settingsload
from llmgw.core.errors import LlmgwError

ROOT = Path(__file__).resolve().parents[2]
BASE_ENV = {"XDG_STATE_HOME": "/xdg/state", "HOME": "/home/u"}


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def _load(tmp_path: Path, text: str | None = None, *, env: dict[str, str] | None = None,
          flags: dict[str, object] | None = None) -> settings.AgentSettings:
    path = _file(tmp_path, text) if text is not None else None
    return settingsload.load(path=path, env={**BASE_ENV, **(env or {})}, flags=flags or {})


def _problems(tmp_path: Path, text: str | None = None, **kw: object) -> list[str]:
    with pytest.raises(settings.SettingsError) as e:
        _load(tmp_path, text, **kw)  # type: ignore[arg-type]
    assert isinstance(e.value, LlmgwError)
    return e.value.problems


def test_defaults_with_only_a_server(tmp_path: Path) -> None:
    """One line of file is enough; every other setting has its documented default."""
    s = _load(tmp_path, "server: cp1\nstate_dir: /var/lib/x\n")
    assert s.servers == ["cp1:8081"] and s.server == "cp1:8081"
    assert (s.heartbeat_interval, s.reconnect_base, s.reconnect_max) == (5.0, 0.5, 30.0)
    assert (s.adopt_ready_timeout, s.stop_grace, s.stop_engines_on_exit) == (60.0, 10.0, False)
    assert s.node_id is None and s.mgmt_addr is None and s.labels == {} and s.fabrics == []
    assert s.discovery.prefer_nvml is True and s.discovery.sysfs_root == Path("/sys/class/infiniband")
    assert s.discovery.nvidia_smi == "nvidia-smi" and s.discovery.saquery == "saquery"


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    """Field by field: a flag beats the environment, which beats the file; a None flag is not given."""
    text = "server: cp1\nheartbeat_interval: 1s\nstop_grace: 3s\nreconnect_max: 1m\nnode_id: from-file\n"
    s = _load(tmp_path, text, env={"LLMGW_AGENT_HEARTBEAT_INTERVAL": "2s", "LLMGW_AGENT_STOP_GRACE": "4",
                                   "LLMGW_AGENT_NODE_ID": "from-env"},
              flags={"heartbeat_interval": 7.5, "stop_grace": None, "model_dirs": []})
    assert s.heartbeat_interval == 7.5
    assert s.stop_grace == 4.0
    assert s.reconnect_max == 60.0
    assert s.node_id == "from-env"


def test_discovery_merges_key_by_key(tmp_path: Path) -> None:
    """A nested variable changes one discovery setting and keeps the file's others."""
    s = _load(tmp_path, "server: cp1\ndiscovery:\n  nvidia_smi: /opt/smi\n  prefer_nvml: true\n",
              env={"LLMGW_AGENT_DISCOVERY__PREFER_NVML": "false"})
    assert s.discovery.prefer_nvml is False and s.discovery.nvidia_smi == "/opt/smi"
    s = _load(tmp_path, "server: cp1\n", flags={"discovery.sysfs_root": Path("/fake/ib")})
    assert s.discovery.sysfs_root == Path("/fake/ib")


def test_engine_python_merges_file_env_and_flags_key_by_key(tmp_path: Path) -> None:
    """engine_python: the file's mapping, LLMGW_AGENT_<ENGINE>_PYTHON and --engine-python k=v, each per engine."""
    text = "server: cp1\nengine_python:\n  vllm: /file/vllm/bin/python\n  sglang: /file/sglang/bin/python\n"
    assert _load(tmp_path, text).engine_python == {"vllm": Path("/file/vllm/bin/python"),
                                                   "sglang": Path("/file/sglang/bin/python")}
    s = _load(tmp_path, text, env={"LLMGW_AGENT_VLLM_PYTHON": "/env/vllm/bin/python"})
    assert s.engine_python == {"vllm": Path("/env/vllm/bin/python"), "sglang": Path("/file/sglang/bin/python")}
    s = _load(tmp_path, text, env={"LLMGW_AGENT_VLLM_PYTHON": "/env/vllm/bin/python"},
              flags={"engine_python": ["sglang=/flag/sglang/bin/python"]})
    assert s.engine_python == {"vllm": Path("/env/vllm/bin/python"), "sglang": Path("/flag/sglang/bin/python")}
    assert _load(tmp_path, "server: cp1\n").engine_python == {}


def test_engine_python_errors_name_the_engine_and_the_source(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A relative python, or an engine llmgw does not run, is refused naming where it came from."""
    problems = _problems(tmp_path, "server: cp1\nengine_python:\n  vllm: /x/python\n",
                         env={"LLMGW_AGENT_SGLANG_PYTHON": "venv/bin/python"})
    assert problems == ["LLMGW_AGENT_SGLANG_PYTHON: must be an absolute path, got venv/bin/python"]
    problems = _problems(tmp_path, "server: cp1\nengine_python:\n  vlm: /x/python\n")
    assert problems == [f"{tmp_path / 'agent.yaml'}: engine_python: vlm is not an engine that runs in a Python of "
                        "its own; name sglang or vllm"]
    flagged = _problems(tmp_path, "server: cp1\n", flags={"engine_python": ["vllm=python3"]})
    assert any(p.startswith("--engine-python: ") and "absolute path" in p for p in flagged), flagged
    with caplog.at_level(logging.WARNING, logger="llmgw.agent.settings"):
        _load(tmp_path, "server: cp1\n", env={"LLMGW_AGENT_VLM_PYTHON": "/x/python"})
    assert "LLMGW_AGENT_VLM_PYTHON is not an agent setting" in caplog.text
    assert "did you mean LLMGW_AGENT_VLLM_PYTHON?" in caplog.text


def test_env_lists_labels_and_fabrics(tmp_path: Path) -> None:
    """Lists are comma-separated, labels k=v pairs or JSON, fabrics JSON; an empty variable is not set."""
    s = _load(tmp_path, env={
        "LLMGW_AGENT_SERVERS": "cp1, cp2:9000,,",
        "LLMGW_AGENT_MODEL_DIRS": "/m1,/m2",
        "LLMGW_AGENT_LABELS": "rack=r12, owner=ml",
        "LLMGW_AGENT_FABRICS": '[{"fabric": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]}]',
        "LLMGW_AGENT_MGMT_ADDR": "",
        "LLMGW_AGENT_CONFIG": "/etc/llmgw/agent.yaml",
    })
    assert s.servers == ["cp1:8081", "cp2:9000"]
    assert s.model_dirs == [Path("/m1"), Path("/m2")]
    assert s.labels == {"rack": "r12", "owner": "ml"}
    assert [(f.fabric, f.hcas) for f in s.fabrics] == [("ib-a", ["mlx5_0", "mlx5_1"])]
    assert s.mgmt_addr is None


def test_server_and_servers_merge(tmp_path: Path) -> None:
    """server comes first, then servers; the agent port is filled in and duplicates dropped."""
    s = _load(tmp_path, "server: cp1\nservers: [cp2, 'cp1:8081', '::1', '[fe80::1]:7000']\n")
    assert s.servers == ["cp1:8081", "cp2:8081", "[::1]:8081", "[fe80::1]:7000"]
    assert s.server == "cp1:8081"
    s = _load(tmp_path, "servers: [a:1, b:2]\n")
    assert s.servers == ["a:1", "b:2"] and s.server == "a:1"


def test_a_higher_source_replaces_every_lower_address(tmp_path: Path) -> None:
    """--server replaces the file's server and servers both, so a test run cannot fail over to production."""
    text = "server: prod1\nservers: [prod2]\n"
    assert _load(tmp_path, text, flags={"server": "test1"}).servers == ["test1:8081"]
    assert _load(tmp_path, text, flags={"server": ["t1", "t2"]}).servers == ["t1:8081", "t2:8081"]
    assert _load(tmp_path, text, env={"LLMGW_AGENT_SERVERS": "e1,e2"}).servers == ["e1:8081", "e2:8081"]


def test_weights_cache_default_rule(tmp_path: Path) -> None:
    """weights_cache defaults to the first model dir, else <state_dir>/weights, and is always a model dir."""
    s = _load(tmp_path, "server: cp\nmodel_dirs: [/data/a, /data/b, /data/a]\nstate_dir: /st\n")
    assert s.weights_cache == Path("/data/a") and s.model_dirs == [Path("/data/a"), Path("/data/b")]
    s = _load(tmp_path, "server: cp\nstate_dir: /st\n")
    assert s.weights_cache == Path("/st/weights") and s.model_dirs == [Path("/st/weights")]
    s = _load(tmp_path, "server: cp\nmodel_dirs: [/data/a]\nweights_cache: /scratch/w\n")
    assert s.model_dirs == [Path("/data/a"), Path("/scratch/w")]


def test_state_dir_is_found_from_the_user() -> None:
    """Root keeps state in /var/lib; anyone else under $XDG_STATE_HOME, else ~/.local/state."""
    assert settings.default_state_dir({}, euid=0) == Path("/var/lib/llmgw/agent")
    assert settings.default_state_dir({"XDG_STATE_HOME": "/x"}, euid=1000) == Path("/x/llmgw/agent")
    assert settings.default_state_dir({"HOME": "/home/u"}, euid=1000) == Path("/home/u/.local/state/llmgw/agent")


def test_durations_accept_numbers_and_units(tmp_path: Path) -> None:
    """Seconds as numbers, numeric strings from the environment, or 500ms / 5s / 2m / 1h30m."""
    s = _load(tmp_path, "server: cp\nheartbeat_interval: 2m\nreconnect_base: 500ms\nadopt_ready_timeout: 1h30m\n",
              env={"LLMGW_AGENT_STOP_GRACE": "12.5"})
    assert (s.heartbeat_interval, s.reconnect_base, s.adopt_ready_timeout, s.stop_grace) == (120, 0.5, 5400, 12.5)


def test_unknown_key_gets_a_did_you_mean(tmp_path: Path) -> None:
    """A misspelt key is refused with the nearest real one, at the top level and under discovery."""
    problems = _problems(tmp_path, "server: cp\nheartbeat_intervl: 5s\ndiscovery:\n  prefer_nmvl: false\n")
    path = tmp_path / "agent.yaml"
    assert f"{path}: heartbeat_intervl: not a setting; did you mean heartbeat_interval?" in problems
    assert f"{path}: discovery.prefer_nmvl: not a setting; did you mean prefer_nvml?" in problems


def test_unknown_env_variable_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A misspelt LLMGW_AGENT_ variable is ignored with a warning that names the nearest real one."""
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        _load(tmp_path, "server: cp\n", env={"LLMGW_AGENT_HEARTBEAT_INTERVL": "1s"})
    assert "LLMGW_AGENT_HEARTBEAT_INTERVL is not an agent setting, and is ignored; did you mean " \
           "LLMGW_AGENT_HEARTBEAT_INTERVAL?" in caplog.text


def test_each_error_names_its_source_and_field(tmp_path: Path) -> None:
    """Every problem is reported at once: file field, environment variable or flag, then what is wrong."""
    text = "server: cp\nfabrics:\n  - fabric: ib-a\n    hcas: []\nlabels: {rack: 5}\nmodel_dirs: [models]\n"
    problems = _problems(tmp_path, text, env={"LLMGW_AGENT_HEARTBEAT_INTERVAL": "soon"},
                         flags={"stop_grace": "-"})
    path = tmp_path / "agent.yaml"
    assert f"{path}: fabrics[0].hcas: must list at least one adapter, such as mlx5_0" in problems
    assert f"{path}: labels: the value of rack must be a string: YAML read it as 5; write it in quotes" in problems
    assert f"{path}: model_dirs[0]: must be an absolute path, got models" in problems
    assert "LLMGW_AGENT_HEARTBEAT_INTERVAL: expected a duration such as 5s, got 'soon'" in problems
    assert "--stop-grace: expected a duration such as 5s, got '-'" in problems
    assert len(problems) == 5


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    """A file that is not YAML is refused with its line number."""
    problems = _problems(tmp_path, "server: cp\nlabels: {a: b\nnode_id: x\n")
    assert len(problems) == 1
    assert re.match(rf"{re.escape(str(tmp_path / 'agent.yaml'))} line \d: not valid YAML: ", problems[0])


@pytest.mark.parametrize(("text", "message"), [
    ("- server: cp\n", "expected settings such as `server: HOST:PORT`, one a line; got a list"),
    ("server: http://cp:8081\n", "server: give HOST:PORT (the agent port, 8081 by default), not a URL"),
    ("servers: ['cp:99999']\n", "servers[0]: 'cp:99999' is not HOST:PORT"),
    ("server: cp\nheartbeat_interval: 0\n", "heartbeat_interval: must be more than 0s"),
    ("server: cp\nreconnect_base: 1m\n", "reconnect_max (30s) must be at least reconnect_base (60s)"),
    ("server: cp\nfabrics: [{fabric: a, hcas: [m0]}, {fabric: b, hcas: [m0]}]\n",
     "fabrics: adapter m0 is on both a and b"),
    ("server: cp\nfabrics: [{hcas: [m0]}]\n", "fabrics[0].fabric: required"),
    ("server: cp\nnode_id: two words\n", "node_id: must be one word"),
    ("server: cp\nstop_engines_on_exit: maybe\n", "stop_engines_on_exit: expected true or false, got 'maybe'"),
])
def test_file_errors(tmp_path: Path, text: str, message: str) -> None:
    """Each kind of bad value in the file gets a message a person can act on."""
    problems = _problems(tmp_path, text)
    assert len(problems) == 1
    assert problems[0].startswith(f"{tmp_path / 'agent.yaml'}: ") and message in problems[0], problems


def test_bad_env_values(tmp_path: Path) -> None:
    """Environment values are checked too, and the message names the variable."""
    problems = _problems(tmp_path, "server: cp\n", env={
        "LLMGW_AGENT_FABRICS": "ib-a=mlx5_0", "LLMGW_AGENT_LABELS": "rack",
        "LLMGW_AGENT_DISCOVERY__PREFER_NVML": "perhaps", "LLMGW_AGENT_RECONNECT_MAX": "0.1"})
    assert problems[0].startswith('LLMGW_AGENT_FABRICS: expected JSON such as [{"fabric": "ib-a"')
    assert "LLMGW_AGENT_LABELS: expected k=v,k2=v2, got 'rack'" in problems
    assert "LLMGW_AGENT_DISCOVERY__PREFER_NVML: expected true or false, got 'perhaps'" in problems
    problems = _problems(tmp_path, "server: cp\n", env={"LLMGW_AGENT_RECONNECT_MAX": "0.1"})
    assert problems == ["LLMGW_AGENT_RECONNECT_MAX: reconnect_max (0.1s) must be at least reconnect_base (0.5s)"]


def test_no_control_plane_address(tmp_path: Path) -> None:
    """With no server anywhere, the message names all three places to set one."""
    assert _problems(tmp_path) == ["no control plane address: set server in agent.yaml, LLMGW_AGENT_SERVER "
                                   "or --server"]
    assert _problems(tmp_path, "heartbeat_interval: 5s\n") == [
        f"no control plane address: set server in {tmp_path / 'agent.yaml'}, LLMGW_AGENT_SERVER or --server"]


def test_missing_or_empty_file(tmp_path: Path) -> None:
    """A named file that does not exist is refused; an empty one means all defaults."""
    with pytest.raises(settings.SettingsError, match="no such file"):
        settingsload.load(path=tmp_path / "absent.yaml", env=BASE_ENV, flags={"server": "cp"})
    assert _load(tmp_path, "", flags={"server": "cp"}).servers == ["cp:8081"]


def test_example_file_is_complete_and_valid(tmp_path: Path) -> None:
    """examples/agent.yaml, uncommented, loads, and shows every setting there is."""
    text = (ROOT / "examples" / "agent.yaml").read_text()
    assert yaml.safe_load(text) is None  # all commented out, so the model-file examples test skips it
    # "# text" is prose; "#key: value", and nested lines under it ("#  - x"), are settings.
    uncommented = "\n".join(line[1:] for line in text.splitlines()
                            if line.startswith("#") and not re.match(r"#( \S|$)", line))
    doc = yaml.safe_load(uncommented)
    assert set(doc) == set(settings.AgentSettings.model_fields)
    assert set(doc["discovery"]) == set(settings.DiscoverySettings.model_fields)
    assert set(doc["engine_python"]) == {"vllm", "sglang"}
    s = settingsload.load(path=_file(tmp_path, uncommented), env={}, flags={})
    assert s.servers[0] == "cp1.example.net:8081"
