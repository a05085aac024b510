"""``GET /api/v1/ca`` and ``GET /api/v1/ca.crt``: the cluster CA's certificate, for clients to pin (issue 28).

No credential: a client fetches it before it trusts the server (``llmgw login``, a standalone router with
``--control-ca-hash``), over a connection it has not verified yet, and trusts what it got only once its hash
matches the one given out of band (``llmgw server`` prints it at start, ``llmgw token create`` in its join
command). The JSON answer carries the PEM and that hash (``pki.ca_hash``: sha256 of the key, as join checks);
``ca.crt`` is the bare PEM as ``application/x-pem-file``, for curl's ``--cacert`` and a browser's import.
Only the public certificate: the CA's key never leaves the data directory.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from llmgw.control.http import schemas
from llmgw.control.http.apierrors import NotFound
from llmgw.core import pki

PATH = "/api/v1/ca"
PEM_PATH = "/api/v1/ca.crt"
PEM_TYPE = "application/x-pem-file"


class ClusterCa(schemas.Body):
    """The cluster CA's certificate (PEM) and the hash a client pins it by."""

    pem: str
    ca_hash: str


def _missing() -> NotFound:
    return NotFound("the cluster CA", "", "this control plane runs with --insecure (no CA, no TLS); clients "
                    "reach it over plain HTTP on loopback", says="is not kept here", code="no_cluster_ca")


def router(ca_pem: bytes | None) -> APIRouter:
    """``ca_pem``: the cluster CA's certificate (``DATA_DIR/pki/ca.crt``); None (``--insecure``): both answer 404."""
    r = APIRouter()
    cert = pki.load_cert(ca_pem) if ca_pem else None  # a bad file fails at start, not at a client's request
    doc = {"pem": ca_pem.decode(), "ca_hash": pki.ca_hash(ca_pem)} if ca_pem and cert is not None else None

    @r.get(PATH, response_model=ClusterCa)
    async def cluster_ca() -> dict[str, Any]:
        """The cluster CA's certificate and its hash (`sha256:` of its key); no credential needed, nothing secret."""
        if doc is None:
            raise _missing()
        return doc

    @r.get(PEM_PATH, response_class=Response, responses={200: {"content": {PEM_TYPE: {}}}})
    async def cluster_ca_pem() -> Response:
        """The cluster CA's certificate as a PEM file (curl --cacert, a browser's certificate import)."""
        if doc is None:
            raise _missing()
        return Response(doc["pem"], media_type=PEM_TYPE,
                        headers={"Content-Disposition": 'attachment; filename="llmgw-cluster-ca.crt"'})

    return r
