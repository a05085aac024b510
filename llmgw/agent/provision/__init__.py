"""The agent installs the engines the control plane asks for (issue 14): ``installer`` owns them all.

``pip`` runs pip and venv (never the machine's pip configuration), ``probe`` sees an install run,
``ospkg`` finds the node's profile and the OS packages a variant needs. Which variant a node gets is
decided in ``llmgw.core.provision.choose_variant`` (pure).
"""

from __future__ import annotations

from llmgw.agent.provision.installer import Installer, ReadyInstall

__all__ = ["Installer", "ReadyInstall"]
