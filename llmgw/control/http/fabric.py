"""``POST /api/v1/fabric/tests``: an RDMA bandwidth test between two nodes (``llmgw fabric test A B``).

The request is answered when the test is done (its duration plus seconds to set
up), with the measurement against the port's rate, or, when either side
failed, with each side's reason and output: 200 either way, since the test
ran. A test that cannot start (an unknown node, one not connected, a port its
node reports down) is refused before anything runs, with the reason.
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter

from llmgw.control import fabric
from llmgw.control.http import schemas
from llmgw.control.http.errors import ApiError
from llmgw.core import fabrictest as ft
from llmgw.core import units


class FabricTestBody(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    #: The server side (it listens); node_b, the client, sends.
    node_a: str = pydantic.Field(min_length=1, max_length=253)
    node_b: str = pydantic.Field(min_length=1, max_length=253)
    hca: str = pydantic.Field(default="", max_length=64)
    port: int = pydantic.Field(default=0, ge=0, le=255)
    #: Message size: bytes, or a size such as "1M" or "64KiB".
    size: int | str = 65536
    duration: int = pydantic.Field(default=5, ge=1, le=600)
    tcp_port: int = pydantic.Field(default=ft.DEFAULT_TCP_PORT, ge=1, le=65535)

    @pydantic.field_validator("node_a", "node_b", "hca")
    @classmethod
    def _text(cls, value: str) -> str:
        # Lone surrogates cannot be encoded into the refusal that names them (a 500 instead of a 400).
        if any(0xD800 <= ord(c) <= 0xDFFF or ord(c) < 0x20 for c in value):
            raise ValueError("must be printable text (no control characters or lone surrogates)")
        return value

    @pydantic.field_validator("size", mode="before")
    @classmethod
    def _size(cls, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(f"expected a size such as 1M or 64KiB, got {value!r}")
        try:
            size = units.parse_bytes(value)
        except OverflowError:  # "999...9" (400 digits) goes through a float that is infinite: a 500 before
            raise ValueError("too large: at most 1 GiB") from None
        if not 1 <= size <= 1 << 30:
            raise ValueError(f"must be between 1 byte and 1 GiB, got {size}")
        return size


class FabricSide(schemas.Body):
    """One side of the test: its port, whether it ran to the end, its error and its output."""

    node: str
    role: str
    hca: str
    port: int
    describe: str
    ok: bool
    error: str
    gbps: schemas.Number
    output: list[str]


class FabricResult(schemas.Body):
    """The measurement against the port's rate (``percent``, ``verdict``), or why either side failed."""

    id: str
    node_a: str
    node_b: str
    ok: bool
    gbps: schemas.Number
    port_rate_gbps: schemas.Number
    percent: schemas.Number
    verdict: str
    size_bytes: int
    duration_s: schemas.Number
    error: str
    server: FabricSide
    client: FabricSide


def router(cluster: Any) -> APIRouter:
    api = APIRouter()

    @api.post("/api/v1/fabric/tests", response_model=FabricResult)
    async def fabric_test(body: FabricTestBody) -> dict[str, Any]:
        try:
            return await fabric.run(cluster, node_a=body.node_a, node_b=body.node_b, hca=body.hca, port=body.port,
                                    size_bytes=int(body.size), duration_s=body.duration, tcp_port=body.tcp_port)
        except fabric.FabricTestRefused as e:  # its status and sentence are fabric's
            raise ApiError(e.status, e.message, code=e.code) from None

    return api
