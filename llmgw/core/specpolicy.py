"""The cluster's spec policy, checked when a model is applied: its env by allowlist, its flags for code.

``llmgw.core.specs.parse_manifest`` refuses what no cluster allows (llmgw's own variables, loader and
path variables: ``envpolicy.hard_refusal``), on the CLI and the server alike. What depends on the
cluster's settings (an admin's ``allowed_env`` names, ``allow_remote_code``) is checked here, by the
control plane at apply, with the settings passed in: the CLI does not know them, and a model stored
before a setting changed still loads (it is not checked again; the agent drops the never-allowed names).
"""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.core import envpolicy, flagpolicy
from llmgw.core.errors import SpecError
from llmgw.core.specs import ModelSpec


def check(spec: ModelSpec, *, allowed_env: Iterable[str] = (), allow_remote_code: bool = False) -> None:
    """Raises ``SpecError`` naming the first env variable or engine flag the cluster does not allow."""
    allowed = frozenset(allowed_env)
    for key, _ in spec.env:
        why = envpolicy.refusal(spec.engine, key, allowed_env=allowed)
        if why is not None:
            raise SpecError(f"spec.env.{key}", why)
    for i, why in flagpolicy.refusals(spec.engine, spec.engine_args, allow_remote_code=allow_remote_code):
        raise SpecError(f"spec.engine_args[{i}]", why)
