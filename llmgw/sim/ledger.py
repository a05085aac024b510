"""The in-memory budget ledger and usage store of tests and benches: ``router.ledger.Ledger``, under its old name.

The hub of a router's workers over a static table uses the same ledger in production (``router.hub``).
"""

from __future__ import annotations

from llmgw.router.ledger import Ledger as SimLedger

__all__ = ["SimLedger"]
