"""The InfiniBand subnet managers each active port sees, from ``sminfo`` and ``saquery``.

Which master SM a port answers to is what tells two physical fabrics apart:
OpenSM's default subnet prefix is the same everywhere, so two fabrics given one
name in the configuration look identical in sysfs, and only their subnet
managers differ. The list of every SM (master and standbys) shows whether a
failover has somewhere to go.

``sminfo -C hca -P port`` names the master. All SMs come from ``saquery SMIR``
(SMInfoRecord): ``saquery -s`` lists the SM-capable ports' PortInfo, which has
neither priority nor state. The list is asked through one port per master,
because every port on one fabric returns the same list. Both tools belong to
infiniband-diags, need access to the umad devices (usually root), and take a
MAD round trip each, so the answer is reused for ``interval_s`` per port rather
than asked at every five-second heartbeat. A node without the tools reports no
subnet managers and says so once.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence

from llmgw.agent.discovery.ib import guid
from llmgw.core.inventory import Hca, SubnetManager

log = logging.getLogger(__name__)
Runner = Callable[..., "subprocess.CompletedProcess[str]"]
STATES = {0: "NOTACTIVE", 1: "DISCOVERING", 2: "STANDBY", 3: "MASTER"}
_SMINFO = re.compile(r"sm lid (\d+) sm guid (0x[0-9a-fA-F]+), activity count \d+ priority (\d+) state (\d+)")
_FIELD = re.compile(r"^\s*([A-Za-z_]+)\.{2,}\s*(.*?)\s*$")


def _state(value: str) -> str:
    """``"3"``, ``"MASTER (3)"`` or ``"SMINFO_MASTER"`` as ``"MASTER"``."""
    number = re.search(r"\d+", value)
    if number and int(number.group()) in STATES:
        return STATES[int(number.group())]
    return value.split()[0].removeprefix("SMINFO_") if value.split() else ""


def parse_sminfo(text: str, *, via: str = "") -> SubnetManager | None:
    """The master SM in one line of ``sminfo`` output; None when it is not there (an error)."""
    m = _SMINFO.search(text)
    if m is None:
        return None
    return SubnetManager(lid=int(m.group(1)), guid=guid(m.group(2)), priority=int(m.group(3)),
                         state=_state(m.group(4)), via=via)


def parse_smir(text: str, *, via: str = "") -> tuple[SubnetManager, ...]:
    """Every ``SMInfoRecord dump:`` block of ``saquery SMIR`` output; a block without a LID is skipped."""
    out: list[SubnetManager] = []
    for block in text.split("SMInfoRecord dump:")[1:]:
        fields = {m.group(1): m.group(2) for m in map(_FIELD.match, block.splitlines()) if m}
        if not fields.get("LID", "").isdigit():
            continue
        priority = fields.get("Priority", "")
        out.append(SubnetManager(lid=int(fields["LID"]), guid=guid(fields.get("GUID", "")),
                                 priority=int(priority) if priority.isdigit() else 0,
                                 state=_state(fields.get("SMState", "")), via=via))
    return tuple(out)


def _describe(sm: SubnetManager | None) -> str:
    return f"lid {sm.lid} guid {sm.guid}" if sm else "none answering"


@dataclasses.dataclass(frozen=True, slots=True)
class _Answer:
    at: float
    master: SubnetManager | None
    others: tuple[SubnetManager, ...]


class SubnetManagerProbe:
    """Asks each active InfiniBand port for its subnet managers, at most once per ``interval_s``."""

    def __init__(self, *, sminfo: str = "sminfo", saquery: str = "saquery", run: Runner = subprocess.run,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = 60.0,
                 which: Callable[[str], str | None] = shutil.which, timeout_s: float = 10.0) -> None:
        self._names = (sminfo, saquery)
        self._run, self._clock, self._interval_s = run, clock, interval_s
        self._which, self._timeout_s = which, timeout_s
        self._tools: tuple[str | None, str | None] | None = None
        self._looked = 0.0
        self._answers: dict[str, _Answer] = {}

    def sample(self, hcas: Sequence[Hca]) -> tuple[SubnetManager, ...]:
        """The master of every active IB port (``via`` "hca/port"), then the other SMs each master's fabric lists."""
        ports = [(h.name, p.port) for h in hcas for p in h.ports
                 if p.usable and p.link_layer in ("InfiniBand", "")]
        if not ports:
            return ()
        now = self._clock()
        # Looked for again once per interval while missing: infiniband-diags may be
        # installed while the agent runs, and should not need a restart to be used.
        if self._tools is None or (self._tools[0] is None and now - self._looked >= self._interval_s):
            first = self._tools is None
            self._tools, self._looked = (self._which(self._names[0]), self._which(self._names[1])), now
            if first and self._tools[0] is None:
                log.info("%s is not installed (infiniband-diags): subnet managers will not be reported, and two "
                         "fabrics given one name cannot be told apart", self._names[0])
        sminfo, saquery = self._tools
        if sminfo is None:
            return ()
        listed: dict[str, tuple[SubnetManager, ...]] = {}
        for hca, port in ports:
            key = f"{hca}/{port}"
            old = self._answers.get(key)
            if old is not None and now - old.at < self._interval_s:
                continue
            text, why = self._ask([sminfo, "-C", hca, "-P", str(port)])
            master = parse_sminfo(text, via=key)
            others: tuple[SubnetManager, ...] = ()
            if master is not None and saquery is not None:
                if master.guid not in listed:
                    listed[master.guid] = parse_smir(self._ask([saquery, "-C", hca, "-P", str(port), "SMIR"])[0])
                others = tuple(dataclasses.replace(s, via=key) for s in listed[master.guid] if s.guid != master.guid)
            if master is None and (old is None or old.master is not None):
                log.warning("no subnet manager answered on %s (%s); is an SM running on that fabric?",
                            key, why or "sminfo printed no SM")
            elif old is not None and old.master is not None and master is not None and old.master.guid != master.guid:
                # A failover is worth a line on the node: the new master re-sweeps, and a
                # fabric that flaps between two masters shows up here before anywhere else.
                log.warning("subnet manager master changed from %s to %s (seen through %s)",
                            _describe(old.master), _describe(master), key)
            self._answers[key] = _Answer(now, master, others)
        # A port that went down is forgotten, so coming back up asks again at once.
        wanted = {f"{h}/{p}" for h, p in ports}
        self._answers = {k: v for k, v in self._answers.items() if k in wanted}
        out: list[SubnetManager] = []
        for key in sorted(self._answers):
            answer = self._answers[key]
            out.extend(() if answer.master is None else (answer.master,))
            out.extend(sorted(answer.others, key=lambda s: (-s.priority, s.lid)))
        return tuple(out)

    def _ask(self, argv: list[str]) -> tuple[str, str]:
        """(stdout, "") or ("", why it failed): hung, exited non-zero, could not run. An argv, never a shell."""
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=self._timeout_s, check=False)
        except subprocess.TimeoutExpired:
            # A MAD to an SM that is gone waits for its retries; without the
            # timeout one heartbeat would wait with it.
            return "", f"{argv[0]} did not answer in {self._timeout_s:g} s"
        except OSError as exc:
            return "", f"could not run {argv[0]}: {exc}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout or "").strip().splitlines()
            return "", f"{argv[0]} exited with {done.returncode}: {said[-1] if said else 'no output'}"
        return done.stdout or "", ""
