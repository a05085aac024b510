"""How routers reach each node's engines (issue 33): directly at its address, or through the tunnel its agent dials.

Held in memory, as the agents say it and the tunnel port sees it: each node's ``engine_access`` (its Register:
direct, tunnel or auto), whether its tunnel is up (and why not), and for auto whether a router reached its engines
(``reachable``). The routers' table reads ``routes()``: the nodes whose replicas are served through their tunnel,
and why each is out of routing while its tunnel is down; ``describe`` is what ``get nodes -o wide`` and
``describe node`` say. Placement never reads it: a node behind NAT takes replicas like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

MODES = ("direct", "tunnel", "auto")


@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    """A tunnelled node, for the table: "" when its tunnel is up, else why its replicas are out of routing."""

    down: str = ""


class EngineAccess:
    def __init__(self, *, on_change: Callable[[], None] = lambda: None) -> None:
        self.on_change = on_change
        self._declared: dict[str, str] = {}
        self._up: set[str] = set()
        self._down: dict[str, str] = {}
        #: auto nodes: why a router could not reach the engines ("": it could), by node.
        self._unreachable: dict[str, str] = {}

    def registered(self, node: str, declared: str) -> None:
        self._declared[node] = declared if declared in MODES else "direct"
        self.on_change()

    def tunnel(self, node: str, up: bool, why: str) -> None:
        if up:
            self._up.add(node)
            self._down.pop(node, None)
        else:
            self._up.discard(node)
            self._down[node] = why
        self.on_change()

    def reachable(self, node: str, why_not: str) -> None:
        """An auto node's check: "" when a router connected to its engines, else why not."""
        if self._unreachable.get(node, None) != why_not:
            self._unreachable[node] = why_not
            self.on_change()

    def auto_nodes(self) -> list[str]:
        return [n for n, mode in self._declared.items() if mode == "auto"]

    def tunnelled(self, node: str) -> bool:
        mode = self._declared.get(node, "direct")
        return mode == "tunnel" or (mode == "auto" and bool(self._unreachable.get(node)))

    def routes(self) -> Mapping[str, Route]:
        out = {}
        for node in self._declared:
            if self.tunnelled(node):
                down = "" if node in self._up else self._down.get(node, "its agent has not dialled the tunnel yet")
                out[node] = Route(down)
        return out

    def describe(self, node: str) -> tuple[str, str]:
        """(how its engines are reached: direct or tunnel, and why) for the node's view; ("", "") unknown."""
        mode = self._declared.get(node)
        if mode is None:
            return "", ""
        tunnel_state = ("its tunnel is up" if node in self._up
                        else f"its tunnel is down: {self._down.get(node, 'not dialled yet')}")
        if mode == "tunnel":
            return "tunnel", f"engine_access tunnel (its agent's setting); {tunnel_state}"
        if mode == "auto":
            why = self._unreachable.get(node)
            if why:
                return "tunnel", f"engine_access auto: a router could not reach its engines ({why}); {tunnel_state}"
            if why is None:
                return "direct", "engine_access auto: not checked yet (the check needs a ready engine)"
            return "direct", "engine_access auto: a router reached its engines at their address"
        return "direct", "engine_access direct (its agent's setting)"
