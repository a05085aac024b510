"""What a node is and has, as its agent measured it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Disk:
    path: str
    total_bytes: int
    free_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    """A node's hardware and the engines it can run."""

    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    disks: tuple[Disk, ...] = ()
    gpus: tuple[Gpu, ...] = ()
    os: str = ""
    arch: str = ""
    engines: tuple[tuple[str, str], ...] = ()  # (name, version)

    def engine_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.engines)
