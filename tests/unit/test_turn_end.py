"""Where an assistant turn ends is read from the model's own chat template, not assumed to be
ChatML's: a chat reply stops there, and the token is trained. Real template shapes, rendered by
transformers with a local tokenizer that has their special tokens."""

from __future__ import annotations

import pytest

from rollwire.consumers.vllm_control import TURN_PROBE, turn_end
from rollwire.trainer.tiny import CHAT_TEMPLATE, build_char_tokenizer

LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
GEMMA = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}"
         "\n{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
MISTRAL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
           "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
NO_END = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.mark.parametrize(("template", "end"), [(CHAT_TEMPLATE, "<|im_end|>"), (LLAMA3, "<|eot_id|>"),
                                               (GEMMA, "<end_of_turn>"), (MISTRAL, "<|eos|>"), (NO_END, None)])
def test_the_end_of_turn_token_is_read_from_the_template(template, end):
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>",
                                                                "<|eot_id|>", "<start_of_turn>", "<end_of_turn>"]})
    tokenizer.chat_template = template
    user = [{"role": "user", "content": "hi"}]

    def render(messages, generation):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True,
                                             return_dict=False)

    found = turn_end(render(user, True), render([*user, {"role": "assistant", "content": TURN_PROBE}], False),
                     tokenizer.encode(TURN_PROBE, add_special_tokens=False))
    assert found == ([tokenizer.convert_tokens_to_ids(end)] if end else [])
