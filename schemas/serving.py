"""Responses served to production apps, recorded in tokens so that feedback on them can train.

    production app ──▶ rollwire serve ──response.served──▶ served ──▶ feedback joiner
                        (receipt id in the response)             (joined with feedback on it)
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwire.schemas.base import Event, now_ms
from rollwire.schemas.rollout import InferenceCall

Endpoint = Literal["chat", "completion"]
"""Which OpenAI endpoint served a response."""

class ResponseServed(Event):
    """One response the serving gateway returned, as the model produced it.

    Produced by the serving gateway on `served` (key: conversation id, or the receipt when the
    client sent none), for the share of responses its `record_fraction` picks; consumed by the
    feedback joiner, which turns feedback on the receipt into training data.
    """

    type: Literal["response.served"] = "response.served"
    response_id: str
    """The receipt: the response's `id` and its `x-rollwire-response-id` header; feedback names it."""
    conversation_id: str | None = None
    """The client's `x-rollwire-conversation-id`, when it sent one."""
    source: str
    """The application that asked (the bearer token's source)."""
    endpoint: Endpoint
    """`/v1/chat/completions` or `/v1/completions`."""
    model: str
    """The model name the client asked for and was served."""
    messages: list[dict[str, str]] = Field(default_factory=list)
    """For `chat`: the conversation as sent (`role`, `content`)."""
    prompt: str | None = None
    """For `completion`: the prompt text as sent."""
    call: InferenceCall
    """The prompt as the server rendered and tokenized it, the sampled ids, their logprobs, the
    weight version of each span and the finish reason: what a trainer needs, with no re-tokenizing."""
    completion: str
    """The text returned to the client."""
    traceparent: str | None = None
    """W3C trace context of the request's span, so feedback's spans can link to it."""
    served_at_ms: int = Field(default_factory=now_ms)
    """When the response was complete (epoch ms)."""

    @property
    def key(self) -> str:
        """The `served` topic key: the conversation, or the receipt."""
        return self.conversation_id or self.response_id
