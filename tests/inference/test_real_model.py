"""A real pretrained checkpoint, end to end on this machine: SmolLM2-135M-Instruct (30 layers, a
49,152-token BPE vocabulary, tied embeddings, ChatML) from its GGUF file (`deploy/models/fetch.py`,
fetched by `make test` before the suite), run by `rollwire run` on the real-model recipe as a user
runs it: imported into the run's base, served by the run's vLLM, trained by the run's trainer and
hot-reloaded each step. Every version served the logprobs the trainer's weights give, and the chat
template's tokens for a conversation with tool turns equal vLLM's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from user_runs import finish, metrics_rows, served_logprob_gaps, start_run

from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "smollm2-135m-arithmetic.toml"
STEPS = 4
"""Four full-weight reloads: at least two of those versions sample tokens before the run ends."""

CONVERSATION = [
    {"role": "system", "content": "You are a shop assistant. Tools answer as the tool role."},
    {"role": "user", "content": "How much are 3 apples?"},
    {"role": "assistant", "content": '<tool_call>{"name": "price", "arguments": {"item": "apple", "quantity": 3}}'
                                     "</tool_call>"},
    {"role": "tool", "content": "1.20"},
    {"role": "assistant", "content": "Three apples cost 1.20."},
    {"role": "user", "content": "And 5?"},
]


def shorter(recipe: str) -> str:
    """The recipe with half its rollouts a step and every version kept (the test reads each back)."""
    changes = {"batch_rollouts = 32": "batch_rollouts = 16", "keep_last = 3": "keep_last = 10"}
    for old, new in changes.items():
        assert old in recipe, f"{RECIPE.name} no longer says {old!r}"
        recipe = recipe.replace(old, new)
    return recipe


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> dict:
    """`rollwire run` of the recipe from the repository root, its GGUF where `make test` fetched it."""
    folder = tmp_path_factory.mktemp("smollm2-run")
    recipe = folder / RECIPE.name
    recipe.write_text(shorter(RECIPE.read_text()))
    run_dir = folder / "run"
    process = start_run(str(recipe), "--steps", str(STEPS), "--run-dir", str(run_dir), cwd=REPO)
    output = finish(process, 800)
    assert process.returncode == 0, output[-4000:]
    return {"run_dir": run_dir, "output": output}


@pytest.fixture(scope="module")
def smollm2(real_run) -> Path:
    """The model the run imported from the GGUF (float32)."""
    return real_run["run_dir"] / "base"


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory) -> Iterator[VllmServer]:
    server = VllmServer(VllmServerSettings(model=str(smollm2), dtype="float32", max_model_len=1024,
                                           log_path=tmp_path_factory.mktemp("smollm2-vllm") / "server.log"))
    server.start()
    yield server
    server.stop()


def test_the_run_serves_each_version_with_the_logprobs_of_the_trainers_weights(real_run):
    """After each full-weight hot reload of the 135M model, the tokens that version sampled score
    the same under its stored weights, within 1e-3 nats: most rollouts are split by a reload (a
    step takes about one generation), each version's span compared on its own. (Measured: 3e-5 at
    most; the neighbouring versions' weights are 0.1 nats off, so a token put down to the wrong
    version would show.)"""
    from rollwire.core.bus import EmbeddedBusSettings, open_log
    run_dir = real_run["run_dir"]
    assert "imported" in real_run["output"] and "LlamaForCausalLM, 30 layers, hidden 576, vocabulary 49,152" \
        in real_run["output"], real_run["output"][-3000:]
    rows = metrics_rows(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    with open_log(EmbeddedBusSettings(path=run_dir / "log")) as log:
        gaps = served_logprob_gaps(log, "smollm2-arithmetic.rollouts", run_dir / "weights")
    # a version that a quick next step replaced before any rollout sampled with it has no tokens to
    # compare (the budget counts from sampling, so rollouts may start later than their tasks)
    assert len(set(range(1, STEPS + 1)) & gaps.keys()) >= STEPS - 2 and max(gaps.values()) < 1e-3, gaps
    print("\nSmolLM2-135M in rollwire run: served vs stored weights' logprobs, largest gap per version: "
          + ", ".join(f"v{v} {g:.1e}" for v, g in gaps.items()))


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
