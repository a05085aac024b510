"""llmgw's version, in one place: the installed package's, which is ``pyproject.toml``'s ``version``.

The control plane, the agent (in its Register), the router and the CLI all say this one; ``llmgw version``
prints them side by side.
"""

from __future__ import annotations

import importlib.metadata

#: What a checkout that is not installed says (no package metadata to read).
UNINSTALLED = "dev"


def version() -> str:
    try:
        return importlib.metadata.version("llmgw")
    except importlib.metadata.PackageNotFoundError:
        return UNINSTALLED
