"""The APIs agents speak, each translated to and from a rollout's recorded calls: what the
interception server (`producers/interception_server.py`) serves on each rollout's URL.

    route                        module               the SDKs that speak it
    POST /v1/chat/completions    openai_chat.py       openai (chat.completions), LangChain, LiteLLM, most agents
    POST /v1/completions         openai_chat.py       openai (completions)
    POST /v1/responses           responses.py         openai (responses), the OpenAI Agents SDK
    POST /v1/messages            anthropic.py         anthropic (messages), Claude agent code

Each turns a request into one `ChatRequest` (`common.py`: the messages and tools as the chat
template takes them) and the sampled text into its own response, or its own stream of server-sent
events; tool calls are read out of the text by `producers/tool_calls.py`, whatever the API. An
assistant turn sent back whose tool calls this rollout issued is rendered as the text the model
sampled for it (`Issued`), so the next prompt extends the sampled tokens.
"""


def agent_variables(base_url: str) -> dict[str, str]:
    """What an agent program's environment says about its rollout's URL, for each SDK:
    `OPENAI_BASE_URL` (ending in /v1) and `ANTHROPIC_BASE_URL` (the same without it), and keys
    the SDKs insist on (the URL needs none). `sandbox_entry.py` sets the same inside a container."""
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "rollwire",
            "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": "rollwire"}
