"""What the agent's https:// fetches verify with: the system's authorities and the cluster's CA (issue 28).

With TLS on its API port, ``llmgw server`` serves its mirror at ``https://SERVER/mirror`` with a certificate
of the cluster CA, which no system trusts. The agent has that CA since it joined (``nodepki``: checked
against the join command's hash), so its fetches trust it beside the system's authorities: the weights
(``transfer``'s connections and the planner's aiohttp session) and pip's engine installs from an https://
index (``bundle``: a file of both, for ``pip --cert``). Trusting the cluster CA for every host adds no one:
the control plane that holds its key already tells this agent what to fetch and run.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import certifi

#: The bundle pip is given, in the agent's state directory (public certificates only: 0644).
BUNDLE = "ca-bundle.pem"


def context(cluster_ca: bytes | None) -> ssl.SSLContext:
    """The system's authorities, and ``cluster_ca`` (PEM) when the node joined a cluster."""
    ctx = ssl.create_default_context()
    if cluster_ca:
        ctx.load_verify_locations(cadata=cluster_ca.decode())
    return ctx


def bundle(state_dir: Path, cluster_ca: bytes | None) -> Path | None:
    """``state_dir/ca-bundle.pem``: certifi's authorities (pip's own) and the cluster CA, written afresh (replaced
    whole); None without a cluster CA (``--insecure``: pip keeps its own)."""
    if not cluster_ca:
        return None
    path = state_dir / BUNDLE
    tmp = path.with_name(f".{BUNDLE}.tmp")  # the state directory is the agent's (0711): no one else writes there
    tmp.write_bytes(Path(certifi.where()).read_bytes().rstrip(b"\n") + b"\n" + cluster_ca)
    tmp.chmod(0o644)
    os.replace(tmp, path)
    return path
