"""A node behind NAT for tests (issue 33): a Linux network namespace joined to this host by a veth pair, whose
firewall (nftables) lets it connect out and nothing connect in, as a NAT router in front of a workstation does.

``behind_nat()`` makes it and removes it (namespace, veth, rules) whatever happens; ``forbidden()`` says why this
machine cannot (not root, no ``ip netns``, no ``nft``), for the test's skip reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import subprocess
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True, slots=True)
class Nat:
    name: str  # the namespace
    host_if: str  # the veth end on this host
    host_ip: str  # this host's address on the link (what the node dials)
    node_ip: str  # the node's address (what nobody can reach)

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def link(self, up: bool) -> None:
        """Cuts (down) or restores (up) the node's only link, as a cable pulled and plugged back."""
        _run(["ip", "link", "set", self.host_if, "up" if up else "down"])


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


def forbidden() -> str:
    """Why this machine cannot make a namespace for a test ("": it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI here runs as root); this run is not"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (make test-deps installs iproute2 and nftables)"
    probe = f"llmgw-probe-{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"this machine forbids network namespaces (`ip netns add` failed: {exc})"
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        _run(["ip", "netns", "del", probe])
    return ""


@contextlib.contextmanager
def behind_nat() -> Iterator[Nat]:
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    octet = random.randrange(1, 250)
    nat = Nat(name=f"llmgw-nat-{tag}", host_if=f"lgh{tag}", host_ip=f"10.233.{octet}.1", node_ip=f"10.233.{octet}.2")
    node_if = f"lgn{tag}"
    # Out, yes; in, only what answers a connection the node made (and its own loopback).
    rules = [["add", "table", "inet", "llmgw_nat"],
             ["add", "chain", "inet", "llmgw_nat", "input", "{ type filter hook input priority 0; policy drop; }"],
             ["add", "rule", "inet", "llmgw_nat", "input", "iif", "lo", "accept"],
             ["add", "rule", "inet", "llmgw_nat", "input", "ct", "state", "established,related", "accept"]]
    try:
        _run(["ip", "netns", "add", nat.name])
        _run(["ip", "link", "add", nat.host_if, "type", "veth", "peer", "name", node_if])
        _run(["ip", "link", "set", node_if, "netns", nat.name])
        _run(["ip", "addr", "add", f"{nat.host_ip}/30", "dev", nat.host_if])
        _run(["ip", "link", "set", nat.host_if, "up"])
        _run(nat.exec_argv(["ip", "addr", "add", f"{nat.node_ip}/30", "dev", node_if]))
        _run(nat.exec_argv(["ip", "link", "set", node_if, "up"]))
        _run(nat.exec_argv(["ip", "link", "set", "lo", "up"]))
        _run(nat.exec_argv(["ip", "route", "add", "default", "via", nat.host_ip]))
        for rule in rules:
            _run(nat.exec_argv(["nft", *rule]))
        yield nat
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _run(["ip", "link", "del", nat.host_if])
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            _run(["ip", "netns", "del", nat.name])
