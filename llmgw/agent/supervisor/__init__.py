"""Engine processes: the only place in the agent that starts a subprocess.

``Supervisor`` (in ``supervising``) is the front; behind it ``launching`` turns
a spec into a process, ``probing`` decides readiness, ``ending`` signals and
describes exits, and ``records`` holds each shard and reports its transitions.
"""

from __future__ import annotations

from llmgw.agent.supervisor.supervising import KILL_WAIT_S, Registry, Supervisor

__all__ = ["KILL_WAIT_S", "Registry", "Supervisor"]
