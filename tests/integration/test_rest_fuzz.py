"""The REST API fuzzed against its own OpenAPI document (schemathesis): no input makes it answer 5xx.

Driven operation by operation with hypothesis rather than through schemathesis's pytest plugin, whose
collection hook does not run under this pytest. Bounded: ``EXAMPLES`` generated requests per operation.
"""

from __future__ import annotations

from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from llmgw.testing import system as system_mod

EXAMPLES = 25


def test_no_generated_input_makes_any_operation_answer_5xx(tmp_path: Path) -> None:
    """Every operation of /api/openapi.json, with generated valid and invalid input, answers without a 5xx."""
    failures: list[str] = []
    calls: list[int] = []
    with system_mod.running(tmp_path) as s:
        schema = schemathesis.openapi.from_url(f"{s.url}/api/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 20  # the document lists the API, not an empty shell
        for op in operations:
            @given(case=op.as_strategy())
            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            def call(case: schemathesis.Case) -> None:
                calls.append(1)
                case.call_and_validate(base_url=s.url, checks=[not_a_server_error])

            try:
                call()
            except (Exception, BaseExceptionGroup) as exc:  # every operation's failure is collected, then reported
                failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:600]}")
    assert not failures, "\n\n".join(failures)
    assert len(calls) >= len(operations) * 5  # the operations were really exercised
