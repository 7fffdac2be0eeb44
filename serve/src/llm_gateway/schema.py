"""The request and response shapes of the public API, OpenAI's plus an allow-list of vLLM's extras.

Requests are validated strictly (JSON types as OpenAI documents them, unknown fields refused);
the committed OpenAPI document is generated from these models.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
_OPEN = ConfigDict(extra="allow")

Stop = (
    Annotated[str, Field(max_length=256)]
    | Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=16)]
)
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = _STRICT
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(BaseModel):
    model_config = _STRICT
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class SamplingParams(BaseModel):
    """Fields both endpoints share: OpenAI's, then vLLM's extra sampling parameters (allow-listed)."""

    model_config = _STRICT

    model: Annotated[str, Field(min_length=1, max_length=256)]
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    n: Annotated[int, Field(ge=1, le=16)] | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: Int64 | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    # vLLM extra sampling parameters
    top_k: Annotated[int, Field(ge=-1, le=100_000)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    length_penalty: Annotated[float, Field(ge=-10.0, le=10.0)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=2**31)]], Field(max_length=64)] | None = None
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: Annotated[str, Field(max_length=4096)] | None = None
    guided_choice: Annotated[list[str], Field(max_length=256)] | None = None
    guided_grammar: Annotated[str, Field(max_length=65_536)] | None = None


class ChatCompletionRequest(SamplingParams):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=1024)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: dict[str, Any] | None = None
    tools: Annotated[list[dict[str, Any]], Field(max_length=128)] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM chat extras
    echo: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    add_special_tokens: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


PromptTokens = Annotated[list[Annotated[int, Field(ge=0, le=2**31)]], Field(min_length=1)]


class CompletionRequest(SamplingParams):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=64)]
        | PromptTokens
        | Annotated[list[PromptTokens], Field(min_length=1, max_length=64)]
    )
    echo: bool | None = None
    best_of: Annotated[int, Field(ge=1, le=16)] | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    add_special_tokens: bool | None = None


# Responses: documented for clients, not validated on the hot path.


class Usage(BaseModel):
    model_config = _OPEN
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    model_config = _OPEN
    role: Literal["assistant"]
    content: str | None = None


class ChatChoice(BaseModel):
    model_config = _OPEN
    index: int
    message: AssistantMessage
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    """Also the shape of the fallback answer, marked by the X-LLM-Gateway-Fallback header."""

    model_config = _OPEN
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    model_config = _OPEN
    index: int
    text: str
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    model_config = _OPEN
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class HealthStatus(BaseModel):
    status: str
    models: dict[str, bool] | None = None
