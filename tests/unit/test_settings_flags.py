"""Every entry point takes every setting of its process's settings dataclass as a flag (issue 25).

The flags are generated from the dataclasses (``llmgw.core.settingsgen``); the names that existed before
are pinned here, so a renamed field cannot silently rename a flag scripts and unit files use.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from llmgw.agent.flags import AgentFlags
from llmgw.agent.settings import AgentSettings
from llmgw.cli import main
from llmgw.core import settingsgen
from llmgw.mirror.settings import MirrorSettings
from llmgw.router import standalone
from llmgw.router.settings import ProxySettings, RouterSettings
from llmgw.serving import config
from llmgw.serving.settings import ServerSettings


def _click_flags(*path: str) -> set[str]:
    command = typer.main.get_command(main.app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def _argparse_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


def _flags_of(cls: type, *, skip: tuple[str, ...] = ()) -> set[str]:
    return {part for s in settingsgen.settings_of(cls) if s.name not in skip
            for part in s.flag.replace(" ", "/").split("/")}


@pytest.mark.parametrize("cls, flags", [
    (ServerSettings, lambda: _click_flags("server")),
    (RouterSettings, lambda: _click_flags("router")),
    (RouterSettings, lambda: _argparse_flags(standalone.parser())),
    (MirrorSettings, lambda: _click_flags("mirror")),
    (AgentFlags, lambda: _click_flags("agent")),
], ids=["llmgw server", "llmgw router", "python -m llmgw.router.standalone", "llmgw mirror", "llmgw agent"])
def test_every_entry_point_takes_every_setting(cls: type, flags: object) -> None:
    missing = _flags_of(cls) - flags()  # type: ignore[operator]
    assert not missing, f"settings with no flag: {sorted(missing)}"


def test_the_server_and_both_routers_take_the_in_process_routers_settings() -> None:
    proxy = _flags_of(ProxySettings)
    assert len(proxy) == 13  # with --batch-concurrency and --batch-waiting-below (issue 32)
    assert proxy <= _click_flags("server") and proxy <= _click_flags("router")


def test_the_flags_that_existed_keep_their_names() -> None:
    assert {"--table-file", "--control", "--token-file", "--host", "--port", "--log-level", "--max-body-bytes",
            "--keepalive", "--header-timeout", "--body-timeout", "--idle-timeout", "--max-connections-per-address",
            "--graceful-shutdown", "--router-id", "--tracing-endpoint", "--admission-queue", "--admission-wait",
            "--admission-order", "--signals-interval", "--config", "--usage-journal-dir", "--workers", "--tls-cert",
            "--tls-key", "--plain-http", "--control-ca", "--control-ca-hash", "--batch-concurrency",
            "--batch-waiting-below"} \
        == _argparse_flags(standalone.parser()) - {"-h", "--help"}
    assert {"--host", "--http-port", "--agent-port", "--join-port", "--data-dir", "--ports-file", "--database",
            "--advertise-address", "--lease", "--lease-renew", "--insecure", "--node-cert-validity", "--node-grace",
            "--unhealthy-grace", "--weights-gc-free-below", "--hub-endpoint", "--mirror-url", "--mirror-dir",
            "--mirror-upstream", "--fetch-allow-private", "--hub-token-file", "--engine-index",
            "--engine-find-links", "--model-installs", "--no-model-installs", "--engine-os-packages",
            "--no-engine-os-packages", "--header-timeout", "--body-timeout", "--idle-timeout",
            "--max-connections-per-address", "--tracing-endpoint", "--audit-retention",
            "--log-level", "--tls", "--plain-http", "--tls-cert", "--tls-key", "--tls-san",
            "--tls-cert-validity"} <= _click_flags("server")
    assert {"--dir", "--host", "--port", "--upstream", "--admin-token-file", "--upstream-token-file", "--tls-cert",
            "--tls-key", "--log-level"} <= _click_flags("mirror")


def test_defaults_are_written_once() -> None:
    """``ServerConfig``'s defaults are ``ServerSettings``'s: the CLI and a config made in code agree."""
    cfg, st = config.ServerConfig(), ServerSettings()
    assert (cfg.host, cfg.http_port, cfg.agent_port, cfg.join_port) == (st.host, st.http_port, st.agent_port,
                                                                        st.join_port)
    assert (cfg.node_grace_s, cfg.unhealthy_grace_s, cfg.weights_gc_free_below_pct) == (
        st.node_grace, st.unhealthy_grace, st.weights_gc_free_below)
    assert (cfg.node_cert_validity_s, cfg.audit_retention_s) == (365 * 86400.0, 90 * 86400.0)
    assert cfg.router == st.router == ProxySettings()


def test_the_settings_are_validated_when_made() -> None:
    with pytest.raises(ValueError, match="--unhealthy-grace cannot be negative"):
        ServerSettings(unhealthy_grace=-1)
    with pytest.raises(ValueError, match="--tracing-endpoint 'x'"):
        ProxySettings(tracing_endpoint="x")
    with pytest.raises(ValueError, match="header timeout"):
        ProxySettings(header_timeout=-1)
    with pytest.raises(ValueError, match="--tls-cert and --tls-key go together"):
        MirrorSettings(dir=Path("/w"), tls_cert=Path("c"))


def test_the_standalone_router_takes_its_settings_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_TRACING_ENDPOINT", "http://collector:4318")
    monkeypatch.delenv("LLMGW_ROUTER_WORKERS", raising=False)  # conftest's one process: the default is compared here
    st = standalone.parse_args(["--control", "http://cp:8080", "--admission-queue", "7", "--idle-timeout", "0"])
    assert st == RouterSettings(control=("http://cp:8080",), proxy=ProxySettings(
        admission_queue=7, idle_timeout=0.0, tracing_endpoint="http://collector:4318"))
    assert st.proxy.limits.idle_timeout_s == 0.0


def test_a_bad_value_is_a_usage_error_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        standalone.parse_args(["--table-file", "t.json", "--max-connections-per-address", "-1"])
    assert exited.value.code == 2
    assert "max connections per address" in capsys.readouterr().err


def test_help_comes_from_the_field() -> None:
    found = {s.name: s for s in settingsgen.settings_of(ServerSettings)}
    assert found["keepalive"].path == ("router", "keepalive")
    assert found["keepalive"].key == "router.keepalive"
    assert "SSE comment" in found["keepalive"].help
    assert found["database"].env == "LLMGW_DATABASE"
    names = [s.name for s in settingsgen.settings_of(ServerSettings)]
    assert len(names) == len(set(names)), "two settings would share a flag"
    assert {f.name for f in dataclasses.fields(ServerSettings)} - {"router"} <= set(names)


def test_the_agents_flags_are_its_settings() -> None:
    """Each of `llmgw agent`'s flags sets one of ``AgentSettings``'s fields, whose default its help names."""
    names = {s.name for s in settingsgen.settings_of(AgentFlags)} - {"config", "log_level"}
    assert names <= set(AgentSettings.model_fields)
    assert _flags_of(AgentFlags, skip=("servers", "insecure")) <= _click_flags("agent", "join")
    helps = {s.name: s.help for s in settingsgen.settings_of(AgentFlags)}
    for name in ("heartbeat_interval", "stop_grace"):
        assert helps[name].endswith(f"[{AgentSettings.model_fields[name].default:g}]")
    assert AgentFlags(servers=("cp:8081",), heartbeat_interval=2.0).settings() == {
        "servers": ["cp:8081"], "node_id": None, "mgmt_addr": None, "state_dir": None, "model_dirs": [],
        "heartbeat_interval": 2.0, "stop_grace": None, "stop_engines_on_exit": None, "engine_python": [],
        "insecure": None, "engine_tls": None, "engine_access": None}


def _click_envvars(*path: str) -> dict[str, str | None]:
    command = typer.main.get_command(main.app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {p.name: p.envvar for p in command.params if p.name}  # type: ignore[misc]


@pytest.mark.parametrize("cls, command, prefix", [
    (ServerSettings, "server", "LLMGW_SERVER_"),
    (RouterSettings, "router", "LLMGW_ROUTER_"),
    (MirrorSettings, "mirror", "LLMGW_MIRROR_"),
])
def test_every_setting_has_its_environment_variable(cls: type, command: str, prefix: str) -> None:
    """Flags and variables come from the same fields: each setting's LLMGW_* is on its option."""
    envvars = _click_envvars(command)
    for s in settingsgen.settings_of(cls):
        assert envvars[s.name] == s.env, s.name
        assert s.env == (s.env if s.env in ("LLMGW_DATABASE", "LLMGW_TRACING_ENDPOINT") else prefix + s.name.upper())


def test_an_environment_variable_sets_the_standalone_router_and_a_flag_overrides_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMGW_ROUTER_CONTROL", "http://a:8080,http://b:8080")
    monkeypatch.setenv("LLMGW_ROUTER_KEEPALIVE", "7.5")
    got = standalone.parse_args([])
    assert got.control == ("http://a:8080", "http://b:8080") and got.proxy.keepalive == 7.5
    assert standalone.parse_args(["--keepalive", "2"]).proxy.keepalive == 2


def test_an_environment_variable_sets_llmgw_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through typer, as the command reads its line: the variables' values, parsed as the flags' would be."""
    monkeypatch.setenv("LLMGW_SERVER_NODE_GRACE", "12")
    monkeypatch.setenv("LLMGW_SERVER_INSECURE", "true")
    monkeypatch.setenv("LLMGW_SERVER_KEEPALIVE", "3")
    command = typer.main.get_command(main.app).commands["server"]  # type: ignore[attr-defined]
    ctx = command.make_context("server", [])
    assert ctx.params["node_grace"] == 12 and ctx.params["insecure"] is True and ctx.params["keepalive"] == 3


def test_a_settings_file_sets_what_no_flag_or_variable_gave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's keys are the settings' own; precedence: flag, then variable, then file, then the default."""
    conf = tmp_path / "server.yaml"
    conf.write_text("node_grace: 11\nrouter:\n  keepalive: 4\nmax_body_bytes: 2048\nidle_timeout: 7\n"
                    "fetch_allow_private: [10.0.0.0/8]\n")
    monkeypatch.setenv("LLMGW_SERVER_MAX_BODY_BYTES", "4096")
    seen: list[ServerSettings] = []

    class Built(Exception):
        """Raised where the command, its settings made, would start logging: nothing is started."""

    def stop(level: str) -> None:
        raise Built

    monkeypatch.setattr(main, "_logging", stop)
    original = settingsgen.build
    monkeypatch.setattr(settingsgen, "build", lambda cls, values: seen.append(original(cls, values)) or seen[-1])
    result = CliRunner().invoke(main.app, ["server", "--config", str(conf), "--node-grace", "9"])
    assert isinstance(result.exception, Built), result.output
    (got,) = seen
    assert got.node_grace == 9                       # the flag beats the file
    assert got.router.max_body_bytes == 4096         # the variable beats the file
    assert got.router.keepalive == 4                 # nested, as a mapping
    assert got.router.idle_timeout == 7              # or by its name
    assert got.fetch_allow_private == ("10.0.0.0/8",)
    conf.write_text("node_grace: soon\n")
    result = CliRunner().invoke(main.app, ["server", "--config", str(conf)])
    assert result.exit_code == 1 and f"{conf}: node_grace" in result.output


def test_a_bad_settings_file_is_refused_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "router.yaml"
    conf.write_text("control: http://127.0.0.1:8080\nkeepalive: soon\n")
    with pytest.raises(SystemExit) as exit_:
        standalone.parse_args(["--config", str(conf)])
    assert exit_.value.code == 2
    assert f"{conf}: keepalive" in capsys.readouterr().err
    conf.write_text("control: http://127.0.0.1:8080\nkeep_alive: 5\n")
    with pytest.raises(SystemExit):
        standalone.parse_args(["--config", str(conf)])
    assert "unknown setting 'keep_alive'" in capsys.readouterr().err
    conf.write_text("control: http://127.0.0.1:8080, http://127.0.0.1:8081\nkeepalive: 5\n")
    got = standalone.parse_args(["--config", str(conf), "--port", "9000"])
    assert got.control == ("http://127.0.0.1:8080", "http://127.0.0.1:8081") and got.proxy.keepalive == 5
    assert got.port == 9000


def test_every_process_takes_a_settings_file() -> None:
    for command in ("server", "router", "mirror"):
        assert "--config" in _click_flags(command), command
    assert "--config" in _argparse_flags(standalone.parser())


def test_workers_is_a_setting_of_both_routers_and_zero_means_one_per_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLMGW_ROUTER_WORKERS", raising=False)
    assert "--workers" in _click_flags("router")
    assert standalone.parse_args(["--table-file", "t.json"]).workers == 0
    assert standalone.parse_args(["--table-file", "t.json", "--workers", "3"]).worker_count == 3
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert RouterSettings(table_file=Path("t.json")).worker_count == 8  # capped
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert RouterSettings(table_file=Path("t.json")).worker_count == 1
    monkeypatch.setenv("LLMGW_ROUTER_WORKERS", "2")
    assert standalone.parse_args(["--table-file", "t.json"]).workers == 2


def test_the_servers_router_workers_default_to_one_per_core_at_most_eight(tmp_path: Path) -> None:
    assert ServerSettings().router_worker_count == max(1, min(os.cpu_count() or 1, 8))
    assert ServerSettings(router_workers=1).router_worker_count == 1
    with pytest.raises(ValueError, match="--router-workers"):
        ServerSettings(router_workers=-1)
    made = config.config_of(ServerSettings(router_workers=3), {}, default_data_dir=tmp_path)
    assert made.router_processes == 3
