"""``llmgw mirror``'s settings: one dataclass, its flags, defaults and help written once here.

The tokens are read from files (never argv, where ``ps`` shows them to every user) or from the
environment: ``LLMGW_MIRROR_ADMIN_TOKEN`` and ``LLMGW_MIRROR_UPSTREAM_TOKEN``. ``llmgw server
--mirror-dir`` mounts the same mirror and reads the admin token from the same variable.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from llmgw.core.settingsgen import setting

#: The admin API's bearer token (POST /admin/add) when no --admin-token-file is given.
TOKEN_ENV = "LLMGW_MIRROR_ADMIN_TOKEN"
#: The upstream's token when no --upstream-token-file is given.
UPSTREAM_TOKEN_ENV = "LLMGW_MIRROR_UPSTREAM_TOKEN"


@dataclasses.dataclass(frozen=True, slots=True)
class MirrorSettings:
    """``llmgw mirror``: a directory of weights served over HTTP; validated when made."""

    #: Every setting without a variable of its own is also read from LLMGW_MIRROR_<NAME> (``settingsgen``).
    ENV_PREFIX: ClassVar[str] = "LLMGW_MIRROR_"

    dir: Path | None = setting(None, help="The weights directory (hf/ORG/REPO/..., files/NAME/...)")
    host: str = setting("127.0.0.1", help="Address to listen on")
    port: int = setting(8090, min=0, max=65535, help="Port to listen on")
    upstream: str = setting("", help="Pull missing files through from this HF-compatible endpoint, e.g. "
                                     "https://huggingface.co [default: off]")
    admin_token_file: Path | None = setting(None, help=f"File holding the admin token for POST /admin/add [env "
                                                       f"{TOKEN_ENV}; default: admin API off]")
    upstream_token_file: Path | None = setting(None, help=f"File holding a token for the upstream [env "
                                                          f"{UPSTREAM_TOKEN_ENV}]")
    tls_cert: Path | None = setting(None, help="Serve HTTPS with this certificate (PEM)")
    tls_key: Path | None = setting(None, help="... and this key (PEM)")
    log_level: str = setting("info", help="The log level: debug, info, warning, error")

    def __post_init__(self) -> None:
        """ValueError with the sentence the CLI prints, naming the flag."""
        if self.dir is None:
            raise ValueError("--dir is required: the directory to serve (created if missing)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together: give both, or neither for plain HTTP")
        if self.upstream and not self.upstream.startswith(("http://", "https://")):
            raise ValueError(f"--upstream {self.upstream!r}: expected http(s)://HOST[:PORT], e.g. "
                             "https://huggingface.co")
