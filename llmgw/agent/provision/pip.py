"""pip and venv, run as processes (argv lists, never a shell), with progress read from pip's output.

pip here never reads the machine's pip configuration: ``PIP_CONFIG_FILE`` is the null device and every
``PIP_*`` variable is dropped, so an ``extra-index-url`` in /etc/pip.conf (this very test machine has one,
and a find-links and a constraints file) cannot add the public index, or another, to the cluster's. The
index is the one the control plane names, or nothing is installed.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

#: pip's lines kept for a Failed install's ``last_output``.
KEEP_LINES = 20

_SIZE = re.compile(r"^\s*(?:Downloading|Using cached)\s+\S+\s+\(([\d.]+)\s*(bytes|kB|MB|GB)\)")
_UNIT = {"bytes": 1, "kB": 1_000, "MB": 1_000_000, "GB": 1_000_000_000}


@dataclasses.dataclass(slots=True)
class Progress:
    """What pip's output said so far: the step and the bytes of the wheels it named."""

    step: str = "resolving"
    bytes_done: int = 0
    bytes_total: int = 0
    _pending: int = 0

    def feed(self, line: str) -> bool:
        """Reads one line; True when the step or the bytes changed."""
        if found := _SIZE.match(line):
            # pip names a file, then downloads it: the one before is done when the next is named.
            self.bytes_done += self._pending
            self._pending = int(float(found.group(1)) * _UNIT[found.group(2)])
            self.bytes_total += self._pending
            self.step = "downloading"
            return True
        if line.startswith("Installing collected packages"):
            self.bytes_done += self._pending
            self._pending = 0
            self.step = "installing"
            return True
        return False


def clean_env() -> dict[str, str]:
    """The agent's environment without pip's settings, and with no pip configuration file read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "VIRTUAL_ENV"}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def pip_here() -> bool:
    """Whether the agent's own python has pip: then venvs are made without one and driven with ``--python``."""
    return importlib.util.find_spec("pip") is not None


def venv_argv(path: Path, *, with_pip: bool) -> list[str]:
    return [sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)]


def pip_argv(python: Path, *args: str) -> list[str]:
    """pip acting on ``python``'s environment: the agent's pip with ``--python`` when it has one (a venv made
    without pip takes a tenth of the time), else the venv's own."""
    if pip_here():
        return [sys.executable, "-m", "pip", "--python", str(python), *args]
    return [str(python), "-m", "pip", *args]


def source_args(index_url: str, find_links: bool) -> list[str]:
    """Where pip looks: only the cluster's index, or only its wheelhouse page."""
    if find_links:
        return ["--no-index", "--find-links", index_url]
    return ["--index-url", index_url]


def install_argv(python: Path, packages: tuple[str, ...], *, index_url: str, find_links: bool,
                 ca_bundle: Path | None = None) -> list[str]:
    """``ca_bundle``: the authorities pip verifies an https:// index with (the system's and the cluster CA, so
    the server's own mirror over TLS verifies); None: pip's own."""
    cert = ["--cert", str(ca_bundle)] if ca_bundle is not None and index_url.lower().startswith("https://") else []
    return pip_argv(python, "install", "--no-input", "--progress-bar", "off", *cert,
                    *source_args(index_url, find_links), *packages)


class Failed(Exception):
    """A step ended badly; ``lines`` are its last lines of output."""

    def __init__(self, message: str, lines: tuple[str, ...]) -> None:
        super().__init__(message)
        self.lines = lines


def run(argv: list[str], *, on_line: Callable[[str], None] = lambda _l: None, timeout_s: float = 3600.0,
        env: dict[str, str] | None = None, what: str = "") -> tuple[str, ...]:
    """Runs ``argv`` to its end, each output line to ``on_line``; its last lines, or Failed with them."""
    last: collections.deque[str] = collections.deque(maxlen=KEEP_LINES)
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", env=env if env is not None else clean_env())
    except OSError as e:
        raise Failed(f"cannot run {argv[0]}: {e.strerror or e}", ()) from None
    try:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            if line:
                last.append(line)
                on_line(line)
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        errors = [line for line in last if line.startswith("ERROR")]
        said = errors[0] if errors else (last[-1] if last else "no output")
        raise Failed(f"{what or Path(argv[0]).name} exited {code}: {said}", tuple(last))
    return tuple(last)
