"""Request bodies of the OpenAI-compatible API (pydantic). Types are strict: a boolean is not a number, a string is
not an integer, NaN is not a temperature; anything wrong becomes a 400 with OpenAI's error body (server/errors.py).

Fields OpenAI clients commonly send that this engine does not act on (user, metadata, penalties, logit_bias, …) are
accepted and ignored, as other OpenAI-compatible servers do; fields it cannot honour (n > 1, a structural_tag) are
refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr, model_validator
from pydantic.json_schema import JsonDict
from pydantic_core import PydanticCustomError


def _integral(value: Any) -> Any:
    """JSON does not tell 2 from 2.0, and JSON Schema's integer admits both: an integral float counts as its int.
    Everything else (strings, booleans, 2.5) meets the strict integer check that follows."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Strict integers (integral floats allowed, see `_integral`); the bounds sit in Field so the schema shows them.
StrictInt = Annotated[int, Field(strict=True), BeforeValidator(_integral)]
PositiveInt = Annotated[int, Field(strict=True, ge=1), BeforeValidator(_integral)]
TokenId = Annotated[
    int, Field(strict=True, ge=0), BeforeValidator(_integral)
]  # schema adds the vocab's top (openapi.py)
TopK = Annotated[int, Field(strict=True, ge=-1), BeforeValidator(_integral)]
ONLY_ONE: JsonDict = {"minimum": 1, "maximum": 1}
Temperature = Annotated[float, Field(strict=True, ge=0.0, le=2.0, allow_inf_nan=False)]
Probability = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
FunctionName = Annotated[str, Field(strict=True, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class Body(BaseModel):
    model_config = ConfigDict(extra="allow")


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """Where in a decoded JSON value a string (or key) holds a lone UTF-16 surrogate (JSON's "\\ud800" escape
    decodes to one), else None. Such a string is not Unicode: the tokenizer cannot take it, nor UTF-8 encode it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, list):
        items = list(enumerate(value))
    else:
        return None
    for key, item in items:
        name = str(key).encode("utf-8", "backslashreplace").decode()  # a bad key is named, not echoed as it is
        where = f"{path}.{name}" if path else name
        found = lone_surrogate(key, where) if isinstance(key, str) else None
        if (found := found or lone_surrogate(item, where)) is not None:
            return found
    return None


class RequestBody(Body):
    """A whole request body: checked once, before any field, for text that is not valid Unicode (400, naming
    where), wherever the text sits (messages, content parts, tools, stop strings, keys)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate(data)
        if where is not None:
            raise PydanticCustomError(
                "invalid_unicode",
                "{where} holds a lone UTF-16 surrogate (such as \\ud800), "
                "which is not valid Unicode; send valid UTF-8 text",
                {"where": where},
            )
        return data


class ImageURL(Body):
    url: StrictStr  # a data: URL (base64 image), or an https URL the server fetches when VISION_URLS=1
    detail: Literal["auto", "low", "high"] | None = None  # accepted; every image is read at the processor's size


class TextPart(Body):
    type: Literal["text"]
    text: StrictStr | None = None


class ImagePart(Body):
    """An image (VISION=1; a server without it publishes no image parts and refuses them)."""

    type: Literal["image_url"]
    image_url: ImageURL


class VideoURL(Body):
    url: StrictStr  # a data: URL (base64 video: data:video/mp4;base64,...), or an https URL with VISION_URLS=1


class VideoPart(Body):
    """A video (VISION=1): sampled at 2 frames a second, its frames read in pairs by the tower."""

    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = Annotated[TextPart | ImagePart | VideoPart, Field(discriminator="type")]


class FunctionCall(Body):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] | None = None


class ToolCall(Body):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[ContentPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    reasoning_content: StrictStr | None = None
    reasoning: StrictStr | None = None


class FunctionSpec(Body):
    name: FunctionName
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(Body):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(Body):
    name: StrictStr


class NamedToolChoice(Body):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(Body):
    include_usage: StrictBool | None = None


class JsonSchemaSpec(Body):
    """response_format's json_schema: `schema` is what the reply must validate against (left out: any JSON)."""

    model_config = ConfigDict(extra="allow", validate_by_name=True)
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one of json (a schema, or its JSON text), regex, choice, grammar (EBNF),
    json_object; disable_any_whitespace keeps JSON to single spaces between its tokens."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True)
    json_: dict[str, Any] | StrictStr | None = Field(None, alias="json")
    regex: StrictStr | None = None
    choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    grammar: StrictStr | None = None
    json_object: StrictBool | None = None
    disable_any_whitespace: StrictBool | None = None


class SamplingFields(RequestBody):
    """What chat and completions share."""

    model: StrictStr | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    top_k: TopK | None = None
    min_p: Probability | None = None
    seed: StrictInt | None = None  # any integer: the sampler keys on its low 64 bits
    stop: StrictStr | Annotated[list[StrictStr], Field(max_length=16)] | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    # What the published schema allows is narrower than what is parsed, so a refusal keeps its own words:
    n: StrictInt | None = Field(None, json_schema_extra=ONLY_ONE)
    ignore_eos: StrictBool | None = None
    priority: Literal["background", "normal", "foreground", "interactive"] | StrictInt | None = None
    draft: StrictBool | None = None
    prompt_reuse: StrictBool | None = None  # false: no kept prompt state is resumed or kept for this request
    cache_salt: Annotated[StrictStr, Field(max_length=256)] | None = None  # kept states shared only within a salt
    return_token_ids: StrictBool | None = None
    # structured outputs (engine/server/formats.py): one of these per request; guided_* are vLLM's older names
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: Annotated[list[StrictStr], Field(min_length=1)] | None = None
    guided_grammar: StrictStr | None = None
    guided_decoding_backend: Literal["xgrammar", "auto"] | None = None


TopLogprobs = Annotated[int, Field(strict=True, ge=0, le=20), BeforeValidator(_integral)]


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None  # > 0 implies logprobs
    max_completion_tokens: PositiveInt | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    reasoning_effort: Effort | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: Annotated[StrictStr, Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)]
    logprobs: TopLogprobs | None = None  # each token's log-probability and this many alternatives
    echo: StrictBool | None = None
    suffix: StrictStr | None = Field(None, json_schema_extra={"enum": ["", None]})
    add_special_tokens: StrictBool | None = False


class TokenizeRequest(RequestBody):
    """Exactly one of `prompt` and `messages` (null is not a way to leave one out)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]}
    )
    model: StrictStr | None = None
    prompt: StrictStr = None  # type: ignore[assignment]
    messages: Annotated[list[ChatMessage], Field(min_length=1)] = None  # type: ignore[assignment]
    add_special_tokens: StrictBool | None = True
    add_generation_prompt: StrictBool | None = True
    tools: list[Tool] | None = None
    reasoning_effort: Effort | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: StrictBool | None = False


class DetokenizeRequest(RequestBody):
    model: StrictStr | None = None
    tokens: list[TokenId]


# -- Anthropic Messages (POST /v1/messages): the blocks a request may hold; anything else is a 400 -------------------


class TextBlock(Body):
    type: Literal["text"]
    text: StrictStr


class ThinkingBlock(Body):
    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(Body):
    type: Literal["redacted_thinking"]
    data: StrictStr | None = None


class Base64Source(Body):
    type: Literal["base64"]
    media_type: StrictStr  # image/png, image/jpeg, image/gif or image/webp
    data: StrictStr  # base64

    @property
    def as_url(self) -> str:
        """The source as the URL a chat image part carries: a data: URL of its bytes."""
        return f"data:{self.media_type};base64,{self.data}"


class URLSource(Body):
    type: Literal["url"]
    url: StrictStr  # fetched when VISION_URLS=1

    @property
    def as_url(self) -> str:
        return self.url


class ImageBlock(Body):
    """An image (VISION=1; a server without it publishes no image blocks and refuses them)."""

    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: StrictStr
    name: FunctionName
    input: dict[str, Any]


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: StrictStr | list[TextBlock] | None = None
    is_error: StrictBool | None = None


AnthropicBlock = Annotated[
    TextBlock | ImageBlock | ThinkingBlock | RedactedThinkingBlock | ToolUseBlock | ToolResultBlock,
    Field(discriminator="type"),
]


class AnthropicMessage(Body):
    role: Literal["user", "assistant"]
    content: StrictStr | list[AnthropicBlock]


class AnthropicTool(Body):
    name: FunctionName
    description: StrictStr | None = None
    input_schema: dict[str, Any]


class AnyToolChoice(Body):
    type: Literal["auto", "any", "none"]
    disable_parallel_tool_use: StrictBool | None = None


class NamedAnthropicToolChoice(Body):
    type: Literal["tool"]
    name: FunctionName
    disable_parallel_tool_use: StrictBool | None = None


AnthropicToolChoice = Annotated[AnyToolChoice | NamedAnthropicToolChoice, Field(discriminator="type")]


class AnthropicThinking(Body):
    type: Literal["enabled", "disabled"]
    budget_tokens: PositiveInt | None = None


class AnthropicOutputFormat(Body):
    """Anthropic's structured outputs: the reply's text is JSON under `schema`."""

    model_config = ConfigDict(extra="allow", validate_by_name=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class AnthropicOutputConfig(Body):
    format: AnthropicOutputFormat | None = None


class MessagesRequest(RequestBody):
    model: StrictStr
    max_tokens: PositiveInt
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: StrictStr | list[TextBlock] | None = None
    stop_sequences: Annotated[list[StrictStr], Field(max_length=16)] | None = None
    stream: StrictBool | None = False
    temperature: Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)] | None = None
    top_p: Probability | None = None
    top_k: TopK | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None
    output_format: AnthropicOutputFormat | None = None  # the beta's name; output_config.format is the current one
    output_config: AnthropicOutputConfig | None = None


class CountTokensRequest(RequestBody):
    model: StrictStr
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: StrictStr | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None


# -- OpenAI Responses (POST /v1/responses): input items; anything else is a 400 ----------------------------------


class _TextOnly(Body):
    text: StrictStr


# text parts, each `type` its own class: a discriminator mapping two values to one schema is read by schemathesis'
# negative cases as allowing only the first (it sent output_text as a value the schema refuses)
class InputTextPart(_TextOnly):
    type: Literal["input_text"]


class OutputTextPart(_TextOnly):
    """A past reply's text sent back: read as text, like input_text."""

    type: Literal["output_text"]


class PlainTextPart(_TextOnly):
    type: Literal["text"]


class InputImagePart(Body):
    """An image (VISION=1; a server without it publishes no image parts and refuses them)."""

    type: Literal["input_image"]
    image_url: StrictStr  # a data: URL, or an https URL fetched when VISION_URLS=1 (file_id is not supported)
    detail: Literal["auto", "low", "high"] | None = None


InputPart = Annotated[InputTextPart | OutputTextPart | PlainTextPart | InputImagePart, Field(discriminator="type")]


class InputMessageItem(Body):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: StrictStr | list[InputPart]


class FunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: StrictStr
    name: FunctionName
    arguments: StrictStr
    id: StrictStr | None = None


class FunctionCallOutputItem(Body):
    type: Literal["function_call_output"]
    call_id: StrictStr
    output: StrictStr


class ReasoningItem(Body):
    """A past reply's reasoning sent back: accepted, not shown to the model again (the chat template drops the
    reasoning of earlier turns)."""

    type: Literal["reasoning"]


ResponseInputItem = InputMessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class ResponsesTool(Body):
    type: Literal["function"]
    name: FunctionName
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ResponsesNamedToolChoice(Body):
    type: Literal["function"]
    name: FunctionName


class ResponsesReasoning(Body):
    effort: Effort | None = None
    summary: StrictStr | None = None


class TextFormat(JsonSchemaSpec):
    """Responses' text.format: json_schema carries name / schema / strict itself (not nested as in chat)."""

    type: Literal["text", "json_object", "json_schema"]


class ResponsesText(Body):
    format: TextFormat | None = None


class ResponsesRequest(RequestBody):
    model: StrictStr | None = None
    input: Annotated[StrictStr, Field(min_length=1)] | Annotated[list[ResponseInputItem], Field(min_length=1)]
    instructions: StrictStr | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice | None = None
    reasoning: ResponsesReasoning | None = None
    text: ResponsesText | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: Probability | None = None
    stream: StrictBool | None = False
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = None
    parallel_tool_calls: StrictBool | None = None
