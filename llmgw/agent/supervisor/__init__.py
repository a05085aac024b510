"""Engine processes: the only place in the agent that starts a subprocess.

``Supervisor`` (in ``supervising``) is the front; behind it ``launching`` turns
a spec into a process, ``process`` owns each engine process (launched or
adopted) and every call to it, ``probing`` asks an engine whether it is ready,
alive, or busy, ``watching`` follows each process, ``liveness`` decides what a
Ready engine's health probe means (UNHEALTHY, READY again), ``draining`` waits
out its requests, ``ending`` signals and describes exits, and ``records``
holds each shard and reports its transitions; ``fetching`` turns a remote
source into the weights fetcher's request and its progress into reports; ``loras``
keeps a running engine's LoRA adapters, ``lorafiles`` fetches those an engine is given at
start (llama.cpp, SGLang) and shows an adapter's fetch. Engines
outlive the agent: ``statefiles`` describes each on disk, ``adopting`` (a part
of ``Supervisor``) writes those files and takes the engines back, ``recovering``
decides what a restarted agent adopts or kills, and ``orphans`` watches and
ends the processes a previous agent started.
"""

from __future__ import annotations

from llmgw.agent.supervisor.supervising import KILL_WAIT_S, Registry, Supervisor

__all__ = ["KILL_WAIT_S", "Registry", "Supervisor"]
