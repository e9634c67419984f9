"""schemathesis hooks for tests/reliability/test_schemathesis.py (loaded through SCHEMATHESIS_HOOKS).

`positive_data_acceptance` expects every schema-valid request to be accepted. Four rules of this API cannot be
written in JSON Schema, and OpenAI answers them with a 400: a prompt plus max_tokens beyond the window
(`context_length_exceeded`: the prompt's length is known only once it is tokenised), a tool_choice naming a
function the request does not offer (`invalid_tool_choice`), a structured-output format that cannot be followed
(`invalid_format`: a JSON schema, regex or grammar the compiler rejects, or two formats asked at once), and an image
or video whose bytes are none the server takes, or too many of them (`invalid_image`, `too_many_images`,
`invalid_video`, `too_many_videos`: a URL string says nothing of what it decodes to). This check is that one with those codes allowed; every other 400 for
schema-valid data still fails it."""

from __future__ import annotations

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

RULES_BEYOND_THE_SCHEMA = {
    "context_length_exceeded",
    "invalid_tool_choice",
    "invalid_format",
    "invalid_image",
    "too_many_images",
    "invalid_video",
    "too_many_videos",
}


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
