"""Simulated users: the second party of the `conversation` harness, who answers the model for
several turns (a customer who gives the order number only when asked, a student who pushes back).

A user is a function `user(row, messages) -> str | None`: it reads the task row and the
conversation so far (ending with the model's last reply) and says the next user message, or None
to end the conversation. Two kinds come with rollwire:

    scripted    says the row's `user_turns` in order, then ends
    a model     another OpenAI-compatible model plays the user (`UserModelSettings`): it is shown
                the conversation from the user's side, with `persona` as its system prompt, and
                ends the conversation by saying `done_marker`

    [[environments]]
    name = "support"
    harness = "conversation"
    harness_options = { max_turns = 3, user = "scripted" }
    # or: harness_options = { user_model = { base_url = "http://127.0.0.1:8001/v1", model = "user",
    #                                        persona = "You are a customer whose order {order} is late." } }

Anything else registered in `USERS`, or named by reference (`package.module:function`,
`path/file.py:function`), is a user too. What a user says reaches the model as prompt tokens of
its next call: environment tokens, masked out of training (`rollwire.producers.assembly`), and
shown in the rollout's trace as `user` messages; each call to a user model is a span
(`simulated user`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from rollwire.core.endpoints import OpenAIEndpoint, replies
from rollwire.core.errors import ConfigError, RollwireError
from rollwire.core.registry import Registry, UnknownNameError

SimulatedUser = Callable[[dict, list[dict]], "str | None"]
"""`user(row, messages) -> the next user message, or None to end the conversation`."""

USERS: Registry[SimulatedUser] = Registry("simulated user", package="rollwire.producers.environments")
"""Users by name: `scripted`, and those the bundled environments register (`higher-lower`)."""


class UserError(RollwireError):
    """The simulated user could not answer; the rollout is errored with this reason."""


def scripted_user(row: dict, messages: list[dict]) -> str | None:
    """Says the row's `user_turns` one after another (the first after the model's first reply)."""
    turns = row.get("user_turns") or []
    said = sum(m.get("role") == "user" for m in messages) - sum(m.get("role") == "user" for m in row["messages"])
    return str(turns[said]) if 0 <= said < len(turns) else None


USERS.add("scripted", scripted_user)


class UserModelSettings(BaseModel):
    """Another model playing the user."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    base_url: str
    """Any OpenAI-compatible endpoint, ending in /v1."""
    model: str
    """The model name the endpoint serves."""
    persona: str = "You are the user. Answer the assistant briefly, as the user would."
    """The user model's system prompt; `{field}` is filled from the task row (e.g. `{order}`)."""
    done_marker: str = "[done]"
    """When the user's reply holds this, the conversation ends (the reply is not said)."""
    api_key: str = "EMPTY"
    max_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=0.7, ge=0)
    timeout_s: float = Field(default=60.0, gt=0)
    retries: int = Field(default=1, ge=0)
    """More tries after an endpoint error."""


class UserModel:
    """A user played by a model: the conversation is shown to it from the user's side (the task's
    own messages and its earlier turns as its replies, the model's replies as what it answers)."""

    def __init__(self, settings: UserModelSettings) -> None:
        self.settings = settings
        self._endpoint = _endpoint(settings.base_url, settings.model, settings.api_key, settings.timeout_s)

    def __call__(self, row: dict, messages: list[dict]) -> str | None:
        s = self.settings
        try:
            persona = s.persona.format(**row)
        except KeyError as exc:
            raise UserError(f"the persona names {exc}, which the task row does not have "
                            f"(its fields: {', '.join(row)})") from None
        flipped = [{"role": "system", "content": persona}] + [
            {"role": "assistant" if m["role"] == "user" else "user", "content": m.get("content") or ""}
            for m in messages if m.get("role") in ("user", "assistant")]
        reasons: list[str] = []
        for _, text, _ in replies(lambda: self._endpoint.chat(flipped, max_tokens=s.max_tokens, temperature=s.temperature),
                                  retries=s.retries, span="simulated user", prefix="rollwire.user",
                                  attributes={"rollwire.user.model": s.model}, reasons=reasons):
            if s.done_marker and s.done_marker.lower() in text.lower():
                return None
            return text.strip()
        raise UserError(f"the user model {s.model} at {s.base_url} did not answer: " + "; ".join(reasons))


@functools.lru_cache(maxsize=32)
def _endpoint(base_url: str, model: str, api_key: str, timeout_s: float) -> OpenAIEndpoint:
    """One client (one pool of connections) per user model, shared by every rollout of a process."""
    return OpenAIEndpoint(base_url, model, api_key=api_key, timeout_s=timeout_s)


def resolve_user(user: str, user_model: UserModelSettings | dict | None) -> SimulatedUser:
    """The user the conversation harness's options name: `user_model` when given, else `user` (a
    name in `USERS` or a reference)."""
    if user_model is not None:
        return UserModel(UserModelSettings.model_validate(user_model))
    try:
        return USERS.get(user)
    except UnknownNameError as exc:
        raise ConfigError(f"{exc}; or give package.module:function, or user_model = {{ base_url, model }}") from None
