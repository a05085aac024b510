"""What ``llmgw server`` says about usage: each grain's retention, the request log's, the threshold webhook."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

from llmgw.core.errors import LlmgwError


class _Settings(Protocol):  # ``serving.settings.ServerSettings``, without importing it (it imports this)
    usage_minute_retention_s: float
    usage_hour_retention_s: float
    usage_day_retention_s: float
    request_log_retention_s: float
    budget_webhook_url: str
    budget_webhook_secret_file: Path | None


@dataclasses.dataclass(frozen=True, slots=True)
class UsageConfig:
    minute_retention_s: float = 2 * 86400.0
    hour_retention_s: float = 90 * 86400.0
    day_retention_s: float = 400 * 86400.0
    #: The per-request log's retention; 0: no log is kept.
    request_log_retention_s: float = 0.0
    #: Where threshold crossings are POSTed ("": nowhere), signed with ``webhook_secret`` when there is one.
    webhook_url: str = ""
    webhook_secret: bytes = dataclasses.field(default=b"", repr=False)

    @property
    def request_log(self) -> bool:
        return self.request_log_retention_s > 0


def usage_config(settings: _Settings) -> UsageConfig:
    """The settings resolved: the webhook's secret read from its file (a secret is never on the command line)."""
    secret = b""
    if settings.budget_webhook_secret_file is not None:
        try:
            secret = settings.budget_webhook_secret_file.read_bytes().strip()
        except OSError as e:
            raise LlmgwError(f"--budget-webhook-secret-file {settings.budget_webhook_secret_file}: cannot read it "
                             f"({e.strerror or e}); give a file holding the secret the webhook's receiver checks "
                             "signatures with") from None
        if not secret:
            raise LlmgwError(f"--budget-webhook-secret-file {settings.budget_webhook_secret_file}: the file is empty; "
                             "write the secret in it")
    return UsageConfig(minute_retention_s=settings.usage_minute_retention_s,
                       hour_retention_s=settings.usage_hour_retention_s,
                       day_retention_s=settings.usage_day_retention_s,
                       request_log_retention_s=settings.request_log_retention_s,
                       webhook_url=settings.budget_webhook_url, webhook_secret=secret)
