"""What ``llmgw server`` says about files and batches: the size limit, the per-project quotas, the claim lease."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True, slots=True)
class FilesConfig:
    #: Where files' bytes are kept on SQLite (the data directory's ``files``); None: in the database.
    dir: Path | None = None
    #: The largest file an upload may be (OpenAI's own limit is 200 MB).
    max_file_bytes: int = 200 << 20
    #: Per project: how many files and how many bytes of them at most (0: no limit).
    max_files_per_project: int = 1000
    max_bytes_per_project: int = 10 << 30
    #: The most lines one batch may have (OpenAI's is 50,000).
    max_lines: int = 50_000
    #: How long a router holds the lines it claimed before another may run them (its answer posted by then).
    lease_s: float = 600.0
