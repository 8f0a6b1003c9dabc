"""Tiny models and tokenizers built locally, for the demo and for tests — nothing downloaded.

    tokenizer = build_char_tokenizer()            # one token per character, ChatML template
    build_tiny_model(path, tokenizer, seed=1)     # a transformers Llama, saved with safetensors
    build_tiny_model(path, build_bpe_tokenizer(), architecture="qwen2", tie_embeddings=True)
                                                  # the shape of Qwen2.5: BPE, tied output layer

The same directory loads in transformers, in the trainer and in vLLM. Several seeds give several
weight versions of one architecture (reload tests); a large `initializer_range` makes a random
model's distributions peaky and distinct, so "did the new weights take effect" is sharp.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIALS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
ALPHABET = string.digits + string.ascii_letters + " :>=+-*/.,?!()\n"

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n\nYou may call functions. Their signatures are in "
    "<tools></tools>:\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\nCall one as "
    "<tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call><|im_end|>\n{% endif %}"
    "{% set ns = namespace(last_query=-1) %}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content = message['content'] or '' %}"
    "{% if message['role'] == 'assistant' and loop.index0 < ns.last_query and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ content }}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>{\"name\": \"{{ call['function']['name'] }}\", "
    "\"arguments\": {{ call['function']['arguments'] | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML as Qwen3 writes it: the tools block of Hermes/Qwen templates when a request has `tools`,
an assistant's `tool_calls` as `<tool_call>` blocks, and the reasoning (`<think>...</think>`) of
assistant turns before the last user message dropped, as Qwen3's template drops it: a conversation
that goes on after such a turn re-renders it shorter than it was sampled (`assemble` branches)."""


def build_char_tokenizer(alphabet: str = ALPHABET):
    """A character-level tokenizer (specials first, then `alphabet`), wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + sorted(set(alphabet)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|pad|>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", bos_token="<|bos|>",
                                        eos_token="<|eos|>", padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_bpe_tokenizer(vocab_size: int = 400, corpus: list[str] | None = None):
    """A byte-level BPE tokenizer (as Qwen's and Llama-3's are) trained here on a small generated
    corpus, with the same special tokens and ChatML template as `build_char_tokenizer`."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    words = ["reverse", "the", "digits", "answer", "sum", "of", "and", "tool", "call", "result", "user", "assistant"]
    corpus = corpus or [" ".join(rng.choice(words) for _ in range(8)) + f" {rng.randrange(10**6)}:" for _ in range(2000)]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<|pad|>", bos_token="<|bos|>",
                                        eos_token="<|eos|>", padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3_moe")


def build_tiny_model(path: str | Path, tokenizer, *, seed: int = 0, hidden: int = 128, layers: int = 2,
                     heads: int = 4, kv_heads: int = 2, intermediate: int = 256, initializer_range: float = 0.02,
                     tie_embeddings: bool = False, max_positions: int = 2048, architecture: str = "llama") -> Path:
    """Saves a randomly initialised model of `architecture` (Llama; Qwen2, with biased q/k/v
    projections; Qwen3, with q/k norms; Qwen3-MoE, 4 experts of `intermediate // 2`, 2 per token)
    and `tokenizer` to `path` (fp32 safetensors)."""
    import torch
    import transformers

    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture {architecture!r}: pick one of {', '.join(ARCHITECTURES)}")
    config_class, model_class = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                                 "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                                 "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                                 "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM")}[architecture]
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, initializer_range=initializer_range,
        tie_word_embeddings=tie_embeddings, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, dtype="float32")
    if architecture.startswith("qwen3"):
        config.head_dim = hidden // heads
    if architecture == "qwen3_moe":
        config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size = 4, 2, intermediate // 2
        config.norm_topk_prob = True
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config)
    # generation ends at the end of sequence or of a chat turn, as real ChatML models' configs say
    # (Qwen2.5's: <|endoftext|> and <|im_end|>), so a server's chat API stops where a turn ends
    turn_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, turn_end] if isinstance(turn_end, int) else tokenizer.eos_token_id)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
