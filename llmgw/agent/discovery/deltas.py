"""Heartbeats that carry the rarely-changing parts only when they changed, and the pacing of their rescans.

The weights list, engines, fabrics, model directories and subnet managers are
long and change rarely, so a heartbeat carries each only when its fingerprint
differs from what the control plane last heard, and ``None`` otherwise. The
distinction matters in one direction especially: a node whose last model was
deleted sends ``()`` (now holds nothing), not ``None`` (nothing to report), or
the control plane would go on placing replicas on weights that are gone.

What the control plane last heard is reset by ``baseline`` at every Register: a
new stream may be a control plane that restarted and knows only what the
registration told it. A build counts as heard; if its send fails, the stream is
broken and the next one registers again.

Measuring is paced separately from sending (``Rescanner``): the heartbeat is
every 5 s, but walking a Lustre tree for weights every 5 s is expensive (30 s is
soon enough to see a copy finish) and probing engines imports Python packages
(every 5 minutes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from llmgw.agent.discovery.files import fingerprint
from llmgw.agent.discovery.load import Load
from llmgw.core.inventory import (
    Fabric,
    Heartbeat,
    Inventory,
    ModelDir,
    NvlinkFabric,
    ShardLoad,
    SubnetManager,
    WeightFile,
)

WEIGHTS_RESCAN_S = 30.0
ENGINES_REPROBE_S = 300.0
_PARTS = ("weights", "fabrics", "engines", "model_dirs", "subnet_managers")
T = TypeVar("T")


class Rescanner(Generic[T]):
    """``get`` runs ``scan`` on the first call and then at most once per ``interval_s``; None in between."""

    def __init__(self, scan: Callable[[], T], *, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._scan, self._interval_s, self._clock = scan, interval_s, clock
        self._at: float | None = None

    def get(self) -> T | None:
        now = self._clock()
        if self._at is not None and now - self._at < self._interval_s:
            return None
        self._at = now
        return self._scan()

    def expire(self) -> None:
        """Makes the next ``get`` scan: after a fetch finished or weights were removed, say so at once."""
        self._at = None


class HeartbeatBuilder:
    """Builds ``Heartbeat``s, remembering the fingerprint of each part the control plane last heard."""

    def __init__(self) -> None:
        self._sent: dict[str, str] = {}

    def baseline(self, inventory: Inventory) -> None:
        """What a Register just told the control plane; the next heartbeats repeat only what differs."""
        self._sent = {part: fingerprint(tuple(getattr(inventory, part))) for part in _PARTS}

    def build(self, load: Load, *, weights: tuple[WeightFile, ...] | None = None,
              fabrics: tuple[Fabric, ...] | None = None, engines: tuple[tuple[str, str], ...] | None = None,
              model_dirs: tuple[ModelDir, ...] | None = None, nvlink: NvlinkFabric | None = None,
              subnet_managers: tuple[SubnetManager, ...] | None = None,
              shard_load: tuple[ShardLoad, ...] | None = None) -> Heartbeat:
        """A heartbeat from ``load``; a part given as None was not measured and is sent as unchanged."""
        return Heartbeat(
            memory_total_bytes=load.memory_total_bytes, memory_available_bytes=load.memory_available_bytes,
            cpu_percent=load.cpu_percent, load1=load.load1, load5=load.load5, load15=load.load15,
            gpus=load.gpus, disks=load.disks, hcas=load.hcas,
            shard_load=load.shard_load if shard_load is None else shard_load,
            weights=self._changed("weights", weights), fabrics=self._changed("fabrics", fabrics),
            engines=self._changed("engines", engines), model_dirs=self._changed("model_dirs", model_dirs),
            subnet_managers=self._changed("subnet_managers", subnet_managers),
            # Already None unless the probe measured on this beat (once a minute).
            nvlink=nvlink,
        )

    def _changed(self, part: str, value: tuple[T, ...] | None) -> tuple[T, ...] | None:
        if value is None:
            return None
        value = tuple(value)
        fp = fingerprint(value)
        if self._sent.get(part) == fp:
            return None
        self._sent[part] = fp
        return value
