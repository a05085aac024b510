"""The exceptions llmgw raises for things a person did wrong or can fix.

Each one carries a message meant to be shown as it is: what was wrong, and
what to do about it. Foreign exceptions are turned into these at the boundary
where they happen, so a caller never has to know which library failed.
"""

from __future__ import annotations


class LlmgwError(Exception):
    """Base class: an error whose message is fit to show a user."""


class SpecError(LlmgwError):
    """A model file (or API body) is invalid. ``field`` is the dotted path of the bad value."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


class EngineError(LlmgwError):
    """An engine cannot be launched with what it was given."""


class ShardIdError(LlmgwError):
    """A string offered as a shard id is not one; the message says what was wrong and what one looks like."""


class FetchError(LlmgwError):
    """Weights could not be fetched into (or removed from) a weights cache; the message says why and what next."""
