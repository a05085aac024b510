"""Which control planes the agent dials: the configured addresses, then those the control planes named.

The accepted Register lists every live control plane; the agent adds those it did not know to its rotation
and keeps them in ``STATE_DIR/controlplanes.json``, so a restarted agent whose configured address is the one
that died still finds the others. Addresses come from another process, so each is checked before it is kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from llmgw.agent import privfile

log = logging.getLogger(__name__)

#: Where the control planes named by the last accepted Register are kept, in the state directory.
CONTROLPLANES_FILE = "controlplanes.json"
#: At most this many learned addresses are kept: a control plane that lists thousands is wrong, not big.
MAX_LEARNED = 64
MAX_ADDR_LEN = 300


def control_addr(raw: object) -> str | None:
    """``raw`` when it is a HOST:PORT a control plane can be dialled at (port 1-65535), else None.

    Addresses come from another process (a Register's answer, a file on disk): one with a space or no
    port would be dialled forever and fail each time, and a huge one would be logged on every round.
    """
    if not isinstance(raw, str) or not raw or len(raw) > MAX_ADDR_LEN or any(c.isspace() for c in raw):
        return None
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            return None
    elif ":" in host or "[" in host or "]" in host or "/" in host:
        return None  # an IPv6 address must be bracketed, and a URL is not an address
    return raw


def _valid(addrs: Iterable[object], source: str) -> list[str]:
    """The valid, distinct addresses of ``addrs`` in order; each invalid one dropped with a warning."""
    kept: list[str] = []
    for raw in addrs:
        addr = control_addr(raw)
        if addr is None:
            log.warning("ignoring control plane address %.80r from %s: it is not HOST:PORT with a port 1-65535 "
                        "(and no whitespace, at most %d characters)", raw, source, MAX_ADDR_LEN)
        elif addr not in kept:
            kept.append(addr)
    return kept


def read_controlplanes(state_dir: Path) -> list[str]:
    """The control plane addresses a previous run stored; [] (with one warning) when the file is unusable."""
    path = state_dir / CONTROLPLANES_FILE
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []  # the usual first start: no control plane has listed its peers yet
    except (OSError, ValueError, UnicodeDecodeError) as e:
        log.warning("ignoring %s: it cannot be read as JSON (%s); it is rewritten at the next registration",
                    path, e)
        return []
    listed = doc.get("controlplanes") if isinstance(doc, dict) else None
    if not isinstance(listed, list):
        log.warning("ignoring %s: it holds no list under \"controlplanes\"; it is rewritten at the next "
                    "registration", path)
        return []
    return _valid(listed, str(path))[:MAX_LEARNED]


def write_controlplanes(state_dir: Path, addrs: Iterable[str]) -> None:
    """Stores ``addrs`` atomically with mode 0600; OSError when the disk refuses."""
    privfile.write_atomic(state_dir / CONTROLPLANES_FILE, json.dumps({"controlplanes": list(addrs)}, indent=1).encode())


class Rotation:
    """The addresses dialled in order: the configured ones, then those learned from control planes."""

    def __init__(self, configured: tuple[str, ...], state_dir: Path) -> None:
        self._configured, self._state_dir = configured, state_dir
        #: The control plane the last accepted Register went to ("": none yet): where the tunnel is dialled.
        self.current = ""
        known = read_controlplanes(state_dir)
        #: Control planes learned from Registers' answers (and the last run's file), after the configured ones.
        self._learned = [a for a in known if a not in configured]
        #: What the file holds now: the same list from the next Register is not written again.
        self._stored = tuple(known)
        if self._learned:
            log.info("control planes known from the last run: %s", ", ".join(self._learned))

    @property
    def servers(self) -> tuple[str, ...]:
        return self._configured + tuple(self._learned)

    def learn(self, listed: Iterable[str], addr: str) -> None:
        """Adds the control planes an accepted Register lists to the rotation, and stores them for the next run."""
        self.current = addr
        addrs = _valid(listed, f"control plane {addr}")[:MAX_LEARNED]
        if not addrs:
            return  # an older control plane, which lists none: what we know stays
        new = [a for a in addrs if a not in self._configured and a not in self._learned]
        if new:
            self._learned = (self._learned + new)[-MAX_LEARNED:]
            log.info("control plane %s lists control planes this agent did not know: %s; added to its rotation",
                     addr, ", ".join(new))
        if tuple(addrs) == self._stored:
            return
        try:
            write_controlplanes(self._state_dir, addrs)
            self._stored = tuple(addrs)
        except OSError as e:
            log.warning("cannot store the control planes' addresses in %s (%s); a restarted agent knows only "
                        "its configured servers", self._state_dir / CONTROLPLANES_FILE, e.strerror or e)
