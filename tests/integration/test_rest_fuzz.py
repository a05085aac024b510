"""The REST API fuzzed against its own OpenAPI document (schemathesis): no input makes it answer 5xx, every
answer matches the response schema the document states for it, and no input without a credential is
answered 2xx.

Driven operation by operation with hypothesis rather than through schemathesis's pytest plugin, whose
collection hook does not run under this pytest. Bounded: ``EXAMPLES`` generated requests per operation.
The document is read with the administrator's token (it needs a viewer's), then fed to schemathesis.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from llmgw.testing import system as system_mod

EXAMPLES = 25
#: What answers without a credential by design: health, and the login that makes one.
#: The cluster CA's certificate (issue 28) is public: clients read it before they trust the server.
PUBLIC = {("GET", "/healthz"), ("POST", "/api/v1/login"), ("GET", "/api/v1/ca"), ("GET", "/api/v1/ca.crt"),
          # Single sign-on makes a credential, so it needs none (tests/integration/test_sso.py).
          ("GET", "/api/v1/sso"), ("POST", "/api/v1/sso/begin"), ("POST", "/api/v1/sso/finish"),
          ("POST", "/api/v1/sso/device"), ("POST", "/api/v1/sso/device/token")}


def _fuzz(schema: Any, each: Callable[[schemathesis.Case], None], *, examples: int = EXAMPLES) -> tuple[list[str], int]:
    """Runs ``each`` on ``examples`` generated cases of every operation; (failures, operations)."""
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20  # the document lists the API, not an empty shell
    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        def call(case: schemathesis.Case) -> None:
            each(case)

        try:
            call()
        except (Exception, BaseExceptionGroup) as exc:  # every operation's failure is collected, then reported
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:600]}")
    return failures, len(operations)


def test_no_generated_input_makes_any_operation_answer_5xx(tmp_path: Path) -> None:
    """Every operation of /api/openapi.json, with generated valid and invalid input, answers without a 5xx, and
    with a body its response schema describes (a refusal: the error body)."""
    calls: list[int] = []
    with system_mod.running(tmp_path) as s:
        schema = schemathesis.openapi.from_dict(s.get("/api/openapi.json"))
        auth = {"Authorization": f"Bearer {s.token}"} if s.token else {}

        def each(case: schemathesis.Case) -> None:
            calls.append(1)
            case.call_and_validate(base_url=s.url, headers=auth, checks=[not_a_server_error,
                                                                         response_schema_conformance])

        failures, operations = _fuzz(schema, each)
    assert not failures, "\n\n".join(failures)
    assert len(calls) >= operations * 5  # the operations were really exercised


def test_no_generated_input_without_a_credential_is_answered_2xx(tmp_path: Path) -> None:
    """Every operation but health and login, with generated input and no credential (or a made-up one), is 401."""
    answered: dict[int, int] = {}
    s = system_mod.System(tmp_path)
    try:
        s.start_server()  # no agent: what is checked happens before any handler runs
        assert s.token, "the system must run secure for this test to mean anything"
        schema = schemathesis.openapi.from_dict(s.get("/api/openapi.json"))

        def each(case: schemathesis.Case) -> None:
            if (case.operation.method.upper(), case.operation.path) in PUBLIC:
                return
            forged = {"Authorization": "Bearer llmgw_aaaaaaaaaaaa_" + "a" * 32} if sum(answered.values()) % 2 else {}
            # The generated case's own headers go, so no Authorization or Cookie of its making slips through.
            case.headers = {k: v for k, v in (case.headers or {}).items()
                            if k.lower() not in ("authorization", "cookie")}
            resp = case.call(base_url=s.url, headers=forged)
            answered[resp.status_code] = answered.get(resp.status_code, 0) + 1
            assert resp.status_code == 401, f"{case.operation.method} {case.formatted_path}: {resp.status_code}"

        failures, operations = _fuzz(schema, each, examples=10)
    finally:
        s.close()
    assert not failures, "\n\n".join(failures)
    assert sum(answered.values()) >= (operations - len(PUBLIC)) * 3, answered
