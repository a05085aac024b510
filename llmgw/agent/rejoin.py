"""What an agent whose certificate the cluster refuses for good does: says so, backs off, and exits.

A revoked node (``llmgw node revoke``, or a rejoin elsewhere that revoked its old certificate) used to
redial every 1-4 s forever, running hardware discovery each time, with a warning per try that scrolled
the one useful line away. The control plane marks such a refusal (``Ack.rejoin``: the certificate is
revoked, or unknown to the cluster's store), which no redial can cure; after ``ROUNDS`` rounds in a row
in which one came (the usual backoff between them, so a control plane restored from an older backup a
moment ago is given the benefit of the doubt), the agent stops with ``EXIT_CODE``, distinct from a
configuration error's 1, so a unit file can say ``RestartPreventExitStatus=3``.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.core.errors import LlmgwError

#: Rounds in a row in which a control plane refused the certificate for good before the agent exits.
ROUNDS = 3
#: The agent's exit status when its certificate is refused for good (1: a configuration error, 2: usage).
EXIT_CODE = 3


class CertificateRefused(LlmgwError):
    """The cluster refuses this node's certificate for good; the message says how to join again."""

    exit_code = EXIT_CODE


def refused(*, node_id: str, state_dir: Path, reason: str, rounds: int) -> CertificateRefused:
    """The exit's sentence: what the control plane said, and the two commands that let the node back in."""
    return CertificateRefused(
        f"the control plane refused this node's certificate {rounds} times in a row: {reason}. No redial can "
        f"change that, so the agent stops. To let node {node_id} back in: on the control plane run "
        f"`llmgw token create --node {node_id}`; on this node move {state_dir / 'pki'} aside and run the "
        "`llmgw agent join --server ... --token ... --ca-hash ...` command it prints")
