"""The HTTP server's limits on reading requests as ``llmgw server`` / ``llmgw router`` options (``router.limits``)."""

from __future__ import annotations

import typer

from llmgw.router import limits as lim

HeaderTimeoutOpt = typer.Option(lim.HEADER_TIMEOUT_S, "--header-timeout", min=0,
                                help=lim.FLAG_HELP["header_timeout_s"].capitalize())
BodyTimeoutOpt = typer.Option(lim.BODY_TIMEOUT_S, "--body-timeout", min=0,
                              help=lim.FLAG_HELP["body_timeout_s"].capitalize())
IdleTimeoutOpt = typer.Option(lim.IDLE_TIMEOUT_S, "--idle-timeout", min=0,
                              help=lim.FLAG_HELP["idle_timeout_s"].capitalize())
MaxPerAddressOpt = typer.Option(lim.MAX_PER_ADDRESS, "--max-connections-per-address", min=0,
                                help=lim.FLAG_HELP["max_per_address"].capitalize())


def argv(header_timeout: float, body_timeout: float, idle_timeout: float, max_per_address: int) -> list[str]:
    """The same settings as the standalone router's flags."""
    return ["--header-timeout", str(header_timeout), "--body-timeout", str(body_timeout),
            "--idle-timeout", str(idle_timeout), "--max-connections-per-address", str(max_per_address)]


def limits(header_timeout: float, body_timeout: float, idle_timeout: float, max_per_address: int) -> lim.Limits:
    return lim.Limits(header_timeout_s=header_timeout, body_timeout_s=body_timeout, idle_timeout_s=idle_timeout,
                      max_per_address=max_per_address)
