"""A real pretrained checkpoint, end to end on this machine: SmolLM2-135M-Instruct (30 layers, a
49,152-token BPE vocabulary, tied embeddings, ChatML) from its GGUF file (`deploy/models/fetch.py`,
fetched by `make test` before the suite), imported by `rollwire model import`, served by a real vLLM
server, trained by a real optimizer step, and reloaded three times: the served logprobs equal the
trainer's on the same tokens after each reload, and the chat template's tokens equal vLLM's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from reference import sampled_rollout

from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
from rollwire.trainer.model import ModelSettings, layout, load_policy, save_model, token_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy" / "models"))
from fetch import fetch  # noqa: E402

CONVERSATION = [
    {"role": "system", "content": "You are a shop assistant. Tools answer as the tool role."},
    {"role": "user", "content": "How much are 3 apples?"},
    {"role": "assistant", "content": '<tool_call>{"name": "price", "arguments": {"item": "apple", "quantity": 3}}'
                                     "</tool_call>"},
    {"role": "tool", "content": "1.20"},
    {"role": "assistant", "content": "Three apples cost 1.20."},
    {"role": "user", "content": "And 5?"},
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """The GGUF imported as a user imports it: `rollwire model import` (float32)."""
    folder = tmp_path_factory.mktemp("smollm2") / "model"
    done = subprocess.run([sys.executable, "-m", "rollwire", "model", "import", str(fetch("smollm2")), "--out",
                           str(folder)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LlamaForCausalLM, 30 layers, hidden 576, vocabulary 49,152" in done.stdout, done.stdout
    return folder


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory) -> Iterator[VllmServer]:
    server = VllmServer(VllmServerSettings(model=str(smollm2), dtype="float32", max_model_len=1024,
                                           log_path=tmp_path_factory.mktemp("smollm2-vllm") / "server.log"))
    server.start()
    yield server
    server.stop()


def test_the_import_keeps_the_tie_the_template_and_the_end_of_turn(smollm2):
    from safetensors import safe_open
    with safe_open(str(smollm2 / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names  # tied: one tensor
    assert len(names) == 1 + 30 * 9 + 1  # embeddings, 9 tensors a layer, the final norm
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["num_hidden_layers"] == 30 and config["vocab_size"] == 49152
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end in json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"]
    assert tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True).endswith(
        "<|im_start|>user\nHow much are 3 apples?<|im_end|>\n<|im_start|>assistant\n")


def test_a_multi_turn_conversation_with_tool_turns_renders_to_the_tokens_vllm_renders(smollm2, served):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    ours = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert served.control.render_chat(CONVERSATION) == ours
    assert served.control.end_of_turn_ids() == [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_served_logprobs_equal_the_trainers_after_three_full_weight_reloads(smollm2, served, tmp_path):
    """Each version is one AdamW step of the trainer's model on a chat sequence (the tie kept, so the
    output layer moves with the embeddings), saved as the trainer saves, hot-reloaded into the
    running server; three sampled answers per version, scored by the trainer in one padded batch."""
    settings = ModelSettings(path=str(smollm2), device="cpu", dtype="float32")
    model = load_policy(settings)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prompts = [served.control.render_chat(CONVERSATION), served.control.render_chat(CONVERSATION[:2]),
               served.control.render_chat(CONVERSATION[:4])]
    gaps = {}
    for version in (1, 2, 3):
        sequence = torch.tensor([prompts[version - 1]])
        model(input_ids=sequence, labels=sequence).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        folder = tmp_path / f"v{version}"
        save_model(model, folder)
        served.control.swap_full_weights(str(folder), str(version))
        rollouts = []
        for index, prompt in enumerate(prompts):
            choice = served.control.generate(prompt, max_tokens=24, temperature=1.0, seed=index, ignore_eos=True,
                                             )["choices"][0]
            assert [s["version"] for s in choice["weight_versions"]] == [str(version)]
            rollouts.append(sampled_rollout(prompt, choice, version, index))
        trainer = load_policy(settings, str(folder)).eval()
        with torch.no_grad():
            ours = token_logprobs(trainer, layout(rollouts, torch.device("cpu")))
        gaps[version] = max(abs(ours[i, j].item() - served_lp) for i, r in enumerate(rollouts)
                            for j, served_lp in enumerate(r.completion_logprobs))
    assert max(gaps.values()) < 1e-3, gaps
    print(f"\nSmolLM2-135M served vs trainer logprobs, largest gap per version: {gaps}")
