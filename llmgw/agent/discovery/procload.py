"""How much CPU and memory each running shard uses: its process and every descendant.

A shard is an engine process tree (vLLM's API server and its workers, a
llama.cpp launcher and its server), so a shard's figure is the sum over the
tree. CPU is ``cpu_percent`` since the previous sample divided by 100, which is
cores busy; it needs a previous sample of the same process object, so the first
sample of a pid only primes the counters and the shard is left out of that
heartbeat rather than reported as idle. A child that appears between samples
reads 0 on its first. RSS is summed too, which counts pages shared between a
parent and its forked workers more than once: an upper bound, not the node's
used memory.
"""

from __future__ import annotations

from collections.abc import Mapping

import psutil

from llmgw.core.inventory import ShardLoad

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # ZombieProcess is a NoSuchProcess


class ShardLoadSampler:
    """Keeps one ``psutil.Process`` per shard process between samples, as ``cpu_percent`` needs."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[psutil.Process, dict[int, psutil.Process]]] = {}

    def sample(self, shard_pids: Mapping[str, int]) -> tuple[ShardLoad, ...]:
        """Load of each shard seen at the previous sample too; dead and new pids are left out."""
        out: list[ShardLoad] = []
        kept: dict[str, tuple[psutil.Process, dict[int, psutil.Process]]] = {}
        for shard_id, pid in sorted(shard_pids.items()):
            known = self._known.get(shard_id)
            try:
                if known is None or known[0].pid != pid or not known[0].is_running():
                    # is_running also compares the start time: a pid the kernel
                    # gave to another process is not the shard's any more.
                    proc = psutil.Process(pid)
                    proc.cpu_percent(interval=None)
                    kept[shard_id] = (proc, self._children(proc, {}))
                    continue
                proc, children = known
                cpu = proc.cpu_percent(interval=None)
                rss = proc.memory_info().rss
                now = self._children(proc, children)
                for child in now.values():
                    try:
                        cpu += child.cpu_percent(interval=None)
                        rss += child.memory_info().rss
                    except _GONE:
                        continue
                kept[shard_id] = (proc, now)
                out.append(ShardLoad(shard_id=shard_id, cpu_cores=cpu / 100.0, rss_bytes=int(rss)))
            except _GONE:
                continue
        self._known = kept
        return tuple(out)

    @staticmethod
    def _children(proc: psutil.Process, before: dict[int, psutil.Process]) -> dict[int, psutil.Process]:
        """Every descendant now, reusing the object a child had last time (else its CPU reads 0 each time)."""
        now: dict[int, psutil.Process] = {}
        for child in proc.children(recursive=True):
            old = before.get(child.pid)
            now[child.pid] = old if old is not None and old == child else child
            if old is None or old != child:
                try:
                    child.cpu_percent(interval=None)
                except _GONE:
                    now.pop(child.pid, None)
        return now
