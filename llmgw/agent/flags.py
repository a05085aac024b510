"""``llmgw agent``'s flags: the settings a command line may give, as one dataclass the CLI generates them from.

Every flag is one of ``AgentSettings``'s fields (``agent.settings``), which holds the defaults: a flag
left out is None here, "not given", so the file and the environment below it are kept
(``settingsload``). Light on purpose: the CLI makes these flags without importing the agent.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from llmgw.core.settingsgen import setting


@dataclasses.dataclass(frozen=True, slots=True)
class AgentFlags:
    """What ``llmgw agent`` and ``llmgw agent join`` were told on the command line."""

    config: Path | None = setting(None, flag="--config -c", help="YAML settings file (see examples/agent.yaml) [env "
                                                                  "LLMGW_AGENT_CONFIG]")
    servers: tuple[str, ...] = setting((), flag="--server", help="Control plane agent address HOST:PORT "
                                       "(repeatable; replaces the file's) [default: where `agent join` joined]")
    insecure: bool = setting(False, help="Loopback development only: plaintext, no certificate, against `llmgw "
                                         "server --insecure`")
    node_id: str | None = setting(None, help="Node id [default: the hostname; once joined, the certificate's]")
    mgmt_addr: str | None = setting(None, help="Address engines listen on [default: this machine's on the route to "
                                               "the control plane]")
    state_dir: Path | None = setting(None, help="Engine logs, state and this node's certificates (pki/) [default "
                                                "/var/lib/llmgw/agent as root, else $XDG_STATE_HOME/llmgw/agent]")
    model_dirs: tuple[Path, ...] = setting((), flag="--model-dir", help="Where model weights live (repeatable)")
    heartbeat_interval: float | None = setting(None, help="Seconds between heartbeats [5]")
    stop_grace: float | None = setting(None, help="Seconds an engine gets between SIGTERM and SIGKILL [10]")
    stop_engines_on_exit: bool = setting(False, help="Stop engines when the agent stops (default: they outlive it "
                                                     "and the next agent adopts them)")
    engine_python: tuple[str, ...] = setting((), help="ENGINE=PYTHON: the Python that has a Python engine "
                                             "installed, e.g. vllm=/opt/vllm/bin/python (repeatable) [env "
                                             "LLMGW_AGENT_VLLM_PYTHON, ...; default: the agent's own]")
    engine_tls: str | None = setting(None, help="TLS on engines: auto (when they listen beyond loopback), on, off "
                                                "[auto; env LLMGW_AGENT_ENGINE_TLS]")
    engine_access: str | None = setting(None, help="How routers reach engines: direct (at the node's address), "
                                                   "tunnel (through a connection the agent dials out: for a node "
                                                   "behind NAT), auto (tunnel when a router cannot reach the "
                                                   "address) [direct; env LLMGW_AGENT_ENGINE_ACCESS]")
    log_level: str = setting("info", help="The log level: debug, info, warning, error")

    def settings(self) -> dict[str, Any]:
        """The flags as ``settingsload.load`` takes them: each keyed by its setting, None where not given."""
        return {"servers": list(self.servers), "node_id": self.node_id, "mgmt_addr": self.mgmt_addr,
                "state_dir": self.state_dir.resolve() if self.state_dir else None,
                "model_dirs": [p.resolve() for p in self.model_dirs], "heartbeat_interval": self.heartbeat_interval,
                "stop_grace": self.stop_grace, "stop_engines_on_exit": True if self.stop_engines_on_exit else None,
                "engine_python": list(self.engine_python), "insecure": True if self.insecure else None,
                "engine_tls": self.engine_tls, "engine_access": self.engine_access}
