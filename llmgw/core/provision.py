"""Engine installs: what the control plane wants on a node and what the node has installed (issue 14).

Pure data here; the agent's installer (``llmgw.agent.provision``) does the installing, the control
plane (``llmgw.control.engines``) decides the wants. An install is an object with a state, reported on
the heartbeat when it changes: a node can run an engine llmgw installed only once it is Ready (installed
and seen to run), never because a binary happens to be on PATH.
"""

from __future__ import annotations

import dataclasses
import enum


class InstallState(enum.StrEnum):
    Installing = "Installing"  # with a step ("downloading", "probing") and progress
    Ready = "Ready"  # installed, and the probe saw it run
    Failed = "Failed"  # with pip's (or the probe's) last lines, and when it is tried again
    Unsupported = "Unsupported"  # no variant for this node, with the reason


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class EngineWant:
    engine: str
    version: str

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"


@dataclasses.dataclass(frozen=True, slots=True)
class Provision:
    """The engines wanted on one node, the whole set (an install not listed is kept), and where from."""

    wants: tuple[EngineWant, ...] = ()
    #: A pip simple index, or with ``find_links`` a flat wheelhouse page; "" means no index is configured.
    index_url: str = ""
    find_links: bool = False
    #: Installs to remove: only directories llmgw created, and never a version a shard runs.
    remove: tuple[EngineWant, ...] = ()
    #: Whether the agent may install the OS packages a variant needs (when it runs as root).
    os_packages: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class EngineInstall:
    """One install on a node, as its agent reports it."""

    engine: str
    version: str
    variant: str
    state: InstallState
    message: str = ""
    bytes_done: int = 0
    bytes_total: int = 0
    last_output: tuple[str, ...] = ()
    path: str = ""
    checked_unix: float = 0.0
    retry_unix: float = 0.0
    missing_os_packages: tuple[str, ...] = ()
    os_install_command: str = ""

    @property
    def want(self) -> EngineWant:
        return EngineWant(self.engine, self.version)

    def sentence(self, node: str) -> str:
        """``Installing vllm 0.32.0 on node05: downloading 1.2/3.4 GB`` and the like, for a replica waiting on it."""
        what = f"{self.engine} {self.version} on {node}"
        if self.state is InstallState.Installing:
            step = self.message or "installing"
            if self.bytes_total:
                step += f" {self.bytes_done / 1e9:.1f}/{self.bytes_total / 1e9:.1f} GB"
            elif self.bytes_done:
                step += f" {self.bytes_done / 1e9:.1f} GB"
            return f"Installing {what}: {step}"
        if self.state is InstallState.Ready:
            return f"{what} is installed"
        return f"{self.state.value}: {what}: {self.message}" if self.message else f"{self.state.value}: {what}"
