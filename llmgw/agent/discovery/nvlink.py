"""The multi-node NVLink domain this node's GPUs joined, and whether IMEX is up.

Read from the ``Fabric`` section ``nvidia-smi -q`` prints per GPU (State,
Status, CliqueId, ClusterUUID, Health) and from ``nvidia-imex-ctl -q`` (which
prints ``READY`` when the IMEX daemon is). GPUs in one NVLink domain share a
cluster UUID and clique id; placement puts the ranks of one multi-node NVLink
replica only on nodes that report the same pair.

Once a minute at most: ``nvidia-smi -q`` takes a second or two, too long for
every heartbeat, and a fabric joined an hour ago rarely changes in five seconds
(when a fabric manager restarts it does, for every card at once). ``sample``
returns a value only on the call that measured, None otherwise, so a heartbeat
carries the fabric only when it was read.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable

from llmgw.core.inventory import NvlinkFabric

log = logging.getLogger(__name__)
Runner = Callable[..., "subprocess.CompletedProcess[str]"]
_GPU = re.compile(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclasses.dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's ``Fabric`` section; "" for a field it did not print or printed as N/A."""

    index: int
    pci_bus_id: str
    state: str = ""
    status: str = ""
    clique_id: str = ""
    cluster_uuid: str = ""
    health: str = ""


def _value(text: str) -> str:
    value = text.strip()
    return "" if value in ("N/A", "Not Supported") else value


def parse_fabric(text: str) -> tuple[GpuFabric, ...]:
    """Each GPU's fabric fields from ``nvidia-smi -q`` text, indexed in the order printed."""
    found: list[tuple[str, dict[str, str]]] = []
    section: str | None = None
    for line in text.splitlines():
        if m := _GPU.match(line):
            found.append((m.group(1), {}))
            section = None
            continue
        key, sep, value = line.strip().partition(":")
        indent = len(line) - len(line.lstrip())
        if not found or not key:
            continue
        if indent == 4:
            section = None if sep else key.strip()
        elif section == "Fabric" and sep:
            # "CliqueId"/"ClusterUUID" from current drivers, "Clique ID" from some;
            # Health's "Summary" is the only nested key kept.
            found[-1][1][key.strip().replace(" ", "").lower()] = _value(value)
    return tuple(GpuFabric(index=i, pci_bus_id=bus, state=f.get("state", ""), status=f.get("status", ""),
                           clique_id=f.get("cliqueid", ""), cluster_uuid=f.get("clusteruuid", ""),
                           health=f.get("summary", ""))
                 for i, (bus, f) in enumerate(found))


def _joined(gpus: tuple[GpuFabric, ...]) -> list[GpuFabric]:
    return [g for g in gpus if g.state and g.cluster_uuid and g.cluster_uuid != _ZERO_UUID]


def summarise(gpus: tuple[GpuFabric, ...], *, imex_state: str = "") -> NvlinkFabric:
    """The node's domain: "Completed" only when every attached GPU completed with Success and is not Unhealthy.

    When the GPUs disagree on the domain, the first GPU's is reported (the probe logs the disagreement).
    """
    attached = [g for g in gpus if g.state]
    if not attached:
        return NvlinkFabric(imex_state=imex_state)
    bad = next((g for g in attached if g.state != "Completed" or g.status not in ("", "Success")
                or g.health == "Unhealthy"), None)
    state = "Completed"
    if bad is not None:
        why = bad.status if bad.status not in ("", "Success") else bad.health if bad.health == "Unhealthy" else ""
        state = f"{bad.state} ({why})" if why else bad.state
    # A zeroed cluster UUID is what a GPU outside any multi-node domain reports
    # (an HGX H100 says Completed with it); taken at face value, every such node
    # would look like one NVLink domain and ranks would be placed across nodes
    # that cannot reach each other over NVLink.
    joined = _joined(gpus)
    first = joined[0] if joined else None
    return NvlinkFabric(state=state, clique_id=first.clique_id if first else "",
                        cluster_uuid=first.cluster_uuid if first else "", imex_state=imex_state)


class NvlinkProbe:
    """Reads the NVLink domain and IMEX state at most once per ``interval_s``."""

    def __init__(self, *, nvidia_smi: str = "nvidia-smi", imex_ctl: str = "nvidia-imex-ctl",
                 run: Runner = subprocess.run, clock: Callable[[], float] = time.monotonic,
                 interval_s: float = 60.0, which: Callable[[str], str | None] = shutil.which,
                 timeout_s: float = 20.0) -> None:
        self._smi, self._imex = nvidia_smi, imex_ctl
        self._run, self._clock, self._interval_s = run, clock, interval_s
        self._which, self._timeout_s = which, timeout_s
        self._asked: float | None = None
        self._said: set[str] = set()
        self.last: NvlinkFabric | None = None

    def sample(self) -> NvlinkFabric | None:
        """The fabric as read now, on a call when one is due and it could be read; None otherwise."""
        now = self._clock()
        if self._asked is not None and now - self._asked < self._interval_s:
            return None
        self._asked = now
        smi = self._which(self._smi)
        if smi is None:
            self._once(logging.INFO, f"{self._smi} is not installed: no NVLink domain will be reported")
            return None
        text, why = self._ask([smi, "-q"])
        if why:
            self._once(logging.WARNING, f"reading the NVLink fabric failed: {why}")
            return None
        per_gpu = parse_fabric(text)
        found = summarise(per_gpu, imex_state=self._imex_state())
        domains = {(g.cluster_uuid, g.clique_id) for g in _joined(per_gpu)}
        if found != self.last and len(domains) > 1:
            log.warning("this node's GPUs report different NVLink domains: %s", ", ".join(
                f"GPU {g.index} {g.cluster_uuid}/{g.clique_id}" for g in _joined(per_gpu)))
        if found != self.last and found.state not in ("", "Completed"):
            log.warning("the NVLink fabric is not complete: %s (cluster %s, clique %s); ranks of a "
                        "multi-node NVLink replica here would not reach their peers over NVLink", found.state,
                        found.cluster_uuid or "none", found.clique_id or "none")
        self.last = found
        return found

    def _imex_state(self) -> str:
        """``nvidia-imex-ctl -q``'s first line ("READY"); "" where IMEX is not installed."""
        imex = self._which(self._imex)
        if imex is None:
            return ""
        # It prints its state even when it exits non-zero (the daemon is not READY).
        lines = self._ask([imex, "-q"], any_exit=True)[0].strip().splitlines()
        return lines[0].strip() if lines else ""

    def _ask(self, argv: list[str], *, any_exit: bool = False) -> tuple[str, str]:
        """(stdout, "") or ("", why it failed). An argv, never a shell, with a timeout."""
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=self._timeout_s, check=False)
        except subprocess.TimeoutExpired:
            # A wedged driver makes nvidia-smi hang for minutes.
            return "", f"{argv[0]} {argv[1]} did not answer in {self._timeout_s:g} s"
        except OSError as exc:
            return "", f"could not run {argv[0]}: {exc}"
        if done.returncode != 0 and not any_exit:
            said = (done.stdout or done.stderr or "").strip().splitlines()
            return "", f"{argv[0]} {argv[1]} exited with {done.returncode}: {said[-1] if said else 'no output'}"
        return done.stdout or "", ""

    def _once(self, level: int, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.log(level, message)
