"""schemathesis hooks for tests/reliability/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

`positive_data_acceptance` expects every schema-valid request to be accepted. Two rules of this API cannot be
written in JSON Schema, and OpenAI answers both with a 400: a prompt plus max_tokens beyond the window
(`context_length_exceeded`: the prompt's length is known only once it is tokenised) and a tool_choice naming a
function the request does not offer (`invalid_tool_choice`). This check is that one with those two codes allowed;
every other 400 for schema-valid data still fails it."""

from __future__ import annotations

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

RULES_BEYOND_THE_SCHEMA = {"context_length_exceeded", "invalid_tool_choice"}


@schemathesis.check
def positive_data_acceptance_beyond_schema(ctx, response, case):  # type: ignore[no-untyped-def]
    if response.status_code == 400:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code in RULES_BEYOND_THE_SCHEMA:
            return None
    return positive_data_acceptance(ctx, response, case)
