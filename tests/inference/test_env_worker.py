"""The env worker against a real vLLM server: rollouts carry exactly the sampled token ids."""

from __future__ import annotations

import re

import pytest
from reference import transformers_logprobs

from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.producers.env_worker import EnvWorker, EnvWorkerSettings
from rollwire.producers.harnesses import completion_harness
from rollwire.producers.tasksets import load_taskset
from rollwire.schemas import Codec, DeadLetter, SamplingParams, TaskAssigned, Topics

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def read(log, topic):
    with log.reader([topic]) as reader:
        out = []
        while batch := reader.poll_batch(1000, 0.5):
            out += [Codec().decode(r.value).event for r in batch]
        return out


def fresh_log(path, prefix: str):
    """An embedded log at `path` with the catalog topics of `prefix`."""
    topics = Topics(prefix)
    log = open_log(EmbeddedBusSettings(path=path))
    log.create_topics(catalog_topics(topics))
    return log, topics


def step_until(worker, rollouts: int, *, tries: int) -> int:
    """Steps `worker` until it has published `rollouts` (or `tries` steps of a second), closes it,
    and returns how many it published."""
    published = 0
    for _ in range(tries):
        published += worker.step(timeout_s=1)
        if published == rollouts:
            break
    worker.close()
    return published


def send_tasks(log, topics, environment: str, rows, *, group_size: int, max_tokens: int,
               temperature: float = 1.0) -> None:
    """One task per row, as the dispatcher would send it."""
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature)
    for row in rows:
        producer.send(topics.tasks, TaskAssigned(task_id=row["task_id"], environment=environment, algorithm="grpo",
                                                 group_size=group_size, task=row, policy_version=0,
                                                 sampling=sampling), key=row["task_id"])
    producer.close()


def test_rollouts_carry_the_sampled_ids_their_rewards_and_errors(vllm_server, tiny_models, version_base, tmp_path):
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    log, topics = fresh_log(tmp_path / "log", "env")
    taskset = load_taskset("reverse-digits", seed=7, count=3)
    rows = list(taskset.rows())
    send_tasks(log, topics, "reverse-digits", rows, group_size=3, max_tokens=8)
    send_tasks(log, topics, "chess", [{"task_id": "x"}], group_size=2, max_tokens=8)

    def harness(row, interceptor):
        if row["task_id"].endswith("-1"):
            raise RuntimeError("the tool server is down")
        return completion_harness(row, interceptor)

    worker = EnvWorker(log, topics, vllm_server.control, {"reverse-digits": taskset},
                       EnvWorkerSettings(concurrency=3), harness=harness)
    step_until(worker, 9, tries=120)  # a deadline, not a speed check: a loaded machine is slow

    rollouts = read(log, topics.rollouts)
    assert len(rollouts) == 9 and len(read(log, topics.traces)) == 9
    errored = [r for r in rollouts if r.error is not None]
    assert {r.task_id for r in errored} == {rows[1]["task_id"]}
    assert all(r.error.kind == "harness_crash" and "tool server is down" in r.error.message for r in errored)
    control = vllm_server.control
    for r in (r for r in rollouts if r.error is None):
        row = next(x for x in rows if x["task_id"] == r.task_id)
        assert r.prompt_token_ids == control._request("POST", "/tokenize", {"prompt": row["prompt"],
                                                                             "add_special_tokens": False})["tokens"]
        assert r.completion_logprobs == pytest.approx(
            transformers_logprobs(tiny_models.base, r.prompt_token_ids, r.completion_token_ids), abs=1e-3)
        assert r.weight_versions[0].version == version_base and r.loss_mask == [1] * len(r.completion_token_ids)
        shown = r.completion_token_ids[:-1] if r.completion_token_ids[-1] == 2 else r.completion_token_ids
        text = control._request("POST", "/detokenize", {"tokens": shown})["prompt"] if shown else ""
        finished = r.completion_token_ids[-1] == 2
        assert r.rewards == {"exact_match": float(finished and text.strip().rstrip(".") == row["answer"])}
        assert r.metrics["completion_tokens"] == len(r.completion_token_ids)
    [letter] = [e for e in read(log, topics.deadletter) if isinstance(e, DeadLetter)]
    assert "no environment 'chess'" in letter.error


def test_a_chat_taskset_runs_through_the_chat_harness_and_records_its_trace(vllm_server, tiny_models, version_base,
                                                                            tmp_path):
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    log, topics = fresh_log(tmp_path / "log", "chat")
    taskset = load_taskset("calculator", seed=2, count=1)
    row = next(taskset.rows())
    send_tasks(log, topics, "calculator", [row], group_size=2, max_tokens=16)
    worker = EnvWorker(log, topics, vllm_server.control, {"calculator": taskset})
    published = sum(worker.step(timeout_s=1) for _ in range(10))
    worker.close()

    rollouts, traces = read(log, topics.rollouts), read(log, topics.traces)
    assert published == 2 and all(r.error is None for r in rollouts)
    rendered = vllm_server.control._request("POST", "/v1/chat/completions/render",
                                            {"model": "policy", "messages": row["messages"],
                                             "add_generation_prompt": True})["token_ids"]
    assert all(r.prompt_token_ids == rendered for r in rollouts)
    for trace in traces:
        calls = [n for n in trace.nodes if n.kind == "llm_call"]
        assert calls and calls[0].call.prompt_token_ids == rendered and all(n.branch == 0 for n in calls)


TOOL_CONVERSATION = [{"role": "system", "content": "calc"}, {"role": "user", "content": "What is 6 * 7?"},
                     {"role": "assistant", "content": "CALL calculator(6 * 7)"}, {"role": "tool", "content": "42"},
                     {"role": "assistant", "content": "42"}]


@pytest.mark.parametrize("runtime", ["in-process", "subprocess"])
def test_a_model_that_calls_the_tool_leaves_a_multi_turn_trace(vllm_server, tiny_models, version_base, tmp_path,
                                                               runtime):
    model = tiny_models.overfitted(tmp_path / "tool-caller", [TOOL_CONVERSATION], seed=5, max_loss=0.05)
    vllm_server.control.swap_full_weights(str(model), str(version_base))
    log, topics = fresh_log(tmp_path / "log", "tool")
    row = {"task_id": "t1", "reference": 42.0, "messages": TOOL_CONVERSATION[:2]}
    send_tasks(log, topics, "calculator", [row], group_size=1, max_tokens=32, temperature=0.0)
    worker = EnvWorker(log, topics, vllm_server.control, {"calculator": load_taskset("calculator")},
                       EnvWorkerSettings(runtime=runtime))
    assert sum(worker.step(timeout_s=1) for _ in range(10)) == 1
    worker.close()
    [rollout], [trace] = read(log, topics.rollouts), read(log, topics.traces)

    assert rollout.error is None and rollout.rewards["correct"] == 1.0  # "42", computed by the tool
    nodes = [(n.kind, n.role, n.content) for n in trace.nodes]
    assert nodes == [("message", "system", "calc"), ("message", "user", "What is 6 * 7?"), ("llm_call", None, ""),
                     ("message", "assistant", "CALL calculator(6 * 7)"), ("tool_result", "tool", "42"),
                     ("llm_call", None, ""), ("message", "assistant", "42")]
    assert [n.parent_id for n in trace.nodes] == [None, 0, 1, 2, 3, 4, 5] and {n.branch for n in trace.nodes} == {0}
    first, second = trace.nodes[2].call, trace.nodes[5].call
    # the second call's prompt is the first call's tokens, as sampled, then the tool turn: one sequence
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.completion_token_ids)] == \
        first.prompt_token_ids + first.completion_token_ids
    tool_turn = second.prompt_token_ids[len(first.prompt_token_ids) + len(first.completion_token_ids):]
    assert tiny_models.tokenizer.decode(tool_turn) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert rollout.prompt_token_ids == first.prompt_token_ids
    assert rollout.completion_token_ids == first.completion_token_ids + tool_turn + second.completion_token_ids
    assert rollout.loss_mask == [1] * len(first.completion_token_ids) + [0] * len(tool_turn) + \
        [1] * len(second.completion_token_ids)
    assert rollout.completion_logprobs == pytest.approx(
        [lp if m else 0.0 for lp, m in zip(transformers_logprobs(model, rollout.prompt_token_ids,
                                                                 rollout.completion_token_ids), rollout.loss_mask)],
        abs=1e-3)


def test_the_env_worker_command_runs_an_agent_program_for_every_rollout(vllm_server, tiny_models, version_base,
                                                                        tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    log_dir = tmp_path / "log"
    log, topics = fresh_log(log_dir, "cli")
    row = {"task_id": "q1", "question": "what is 6*7?", "reference": 42.0,
           "messages": [{"role": "user", "content": "what is 6*7?"}]}
    send_tasks(log, topics, "calculator", [row], group_size=2, max_tokens=8)
    agent = Path(__file__).resolve().parent.parent / "data" / "agent.py"
    result = subprocess.run([sys.executable, "-m", "rollwire.cli", "env-worker", "--base-url", vllm_server.base_url,
                             "--env", "calculator", "--agent-command", f"{sys.executable} {agent}",
                             "--exit-when-idle", "3", "--log-dir", str(log_dir), "--prefix", "cli"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"rollouts_published": 2}
    rollouts = read(log, topics.rollouts)
    assert [r.error for r in rollouts] == [None, None]
    assert all(0 in r.loss_mask and r.loss_mask[0] == 1 for r in rollouts)  # two sampled turns, tool tokens masked


RECORDING_HARNESSES = '''
import os
from rollwire.producers.harnesses import chat_harness, completion_harness

def _record(environment):
    with open(os.environ["WHERE_FILE"], "a") as out:
        out.write(f"{environment} {os.getpid()}\\n")

def chat(row, client):
    _record("calculator")
    return chat_harness(row, client)

def completion(row, client):
    _record("reverse-digits")
    return completion_harness(row, client)
'''


def test_one_worker_runs_each_environment_with_the_harness_and_runtime_its_setup_names(
        vllm_server, tiny_models, version_base, tmp_path, monkeypatch):
    """Three environments in one worker, as a recipe mixes them: a completion harness in process, a
    chat harness in a subprocess, and an unmodified agent program; each rollout says which ran it."""
    import os
    import sys
    from pathlib import Path

    from rollwire.producers.environment import EnvironmentSetup
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    (tmp_path / "recording_harnesses.py").write_text(RECORDING_HARNESSES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the subprocess runtime's child imports it too
    monkeypatch.setenv("WHERE_FILE", str(tmp_path / "where.txt"))
    log, topics = fresh_log(tmp_path / "log", "mixed")
    reverse = load_taskset("reverse-digits", seed=4, count=1)
    calculator = load_taskset("calculator", seed=4, count=1)
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"question": "What is 6 times 7?", "answer": "#### 42"}\n')
    math_word = load_taskset("math-word", path=str(questions))
    for name, taskset in (("reverse-digits", reverse), ("calculator", calculator), ("math-word", math_word)):
        send_tasks(log, topics, name, list(taskset.rows()), group_size=2, max_tokens=8)
    agent = Path(__file__).resolve().parent.parent / "data" / "agent.py"
    setups = {"reverse-digits": EnvironmentSetup(harness="recording_harnesses:completion"),
              "calculator": EnvironmentSetup(harness="recording_harnesses:chat", runtime="subprocess"),
              "math-word": EnvironmentSetup(agent_command=[sys.executable, str(agent)])}
    worker = EnvWorker(log, topics, vllm_server.control,
                       {"reverse-digits": reverse, "calculator": calculator, "math-word": math_word},
                       EnvWorkerSettings(rollout_timeout_s=120), setups=setups)
    published = step_until(worker, 6, tries=60)
    rollouts = read(log, topics.rollouts)
    assert published == 6 and [r.error for r in rollouts] == [None] * 6, [r.error for r in rollouts]
    assert sorted(r.environment for r in rollouts) == ["calculator"] * 2 + ["math-word"] * 2 + ["reverse-digits"] * 2
    where = [line.split() for line in (tmp_path / "where.txt").read_text().splitlines()]
    assert sorted(env for env, _ in where) == ["calculator"] * 2 + ["reverse-digits"] * 2
    assert {int(pid) == os.getpid() for env, pid in where if env == "reverse-digits"} == {True}  # in process
    assert {int(pid) == os.getpid() for env, pid in where if env == "calculator"} == {False}  # in its subprocess
    # the agent program's two model calls (a tool result between them) are both in its rollouts: on one
    # line, or the second on a branch where the random model's first reply does not re-tokenize as sampled
    # (the tiny test tokenizer's BPE has other spellings of the same text)
    assert all(r.loss_mask.count(0) > 0 or r.metrics["rollwire.branched_calls"] == 1.0
               for r in rollouts if r.environment == "math-word"), [(r.loss_mask, r.metrics) for r in rollouts]


NO_BRANCH = {"rollwire.branched_calls": 0.0, "rollwire.untrained_tokens": 0.0}
"""What a rollout's metrics say when every call extended the tokens before it (`Assembly.metrics`)."""


def _zero_runs(rollout) -> list[list[int]]:
    """The completion's runs of environment tokens (loss mask 0), in order."""
    runs, run = [], []
    for token, mask in zip(rollout.completion_token_ids, rollout.loss_mask):
        if mask:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(token)
    return runs + ([run] if run else [])


def test_a_conversation_with_a_simulated_user_trains_only_the_models_turns(vllm_server, tiny_models, version_base,
                                                                            tmp_path):
    """higher-lower's Python user answers a model overfitted to one game (10, 15, 13 for the secret
    13), and, in a second environment, the served model itself plays the user through its OpenAI
    API: every user turn is in the trace and masked out of training, and the rewards read the whole
    conversation."""
    from rollwire.producers.environment import EnvironmentSetup
    taskset = load_taskset("higher-lower", seed=0, count=1)
    row = {**next(taskset.rows()), "task_id": "hl-13", "secret": 13}
    game = row["messages"] + [{"role": "assistant", "content": "10"}, {"role": "user", "content": "Higher."},
                              {"role": "assistant", "content": "15"}, {"role": "user", "content": "Lower."},
                              {"role": "assistant", "content": "13"}]
    model = tiny_models.overfitted(tmp_path / "guesser", [game], seed=6, max_loss=0.05)
    vllm_server.control.swap_full_weights(str(model), str(version_base))
    log, topics = fresh_log(tmp_path / "log", "talk")
    send_tasks(log, topics, "higher-lower", [row], group_size=1, max_tokens=8, temperature=0.0)
    send_tasks(log, topics, "model-user", [{**row, "task_id": "hl-model"}], group_size=1, max_tokens=8,
               temperature=0.0)
    user_model = {"base_url": f"{vllm_server.base_url}/v1", "model": "policy", "max_tokens": 6, "temperature": 0.0}
    worker = EnvWorker(log, topics, vllm_server.control, {"higher-lower": taskset, "model-user": taskset},
                       setups={"model-user": EnvironmentSetup(harness_options={"user_model": user_model,
                                                                               "max_turns": 2})})
    assert step_until(worker, 2, tries=120) == 2
    rollouts = {r.environment: r for r in read(log, topics.rollouts)}
    traces = {t.rollout_id: t for t in read(log, topics.traces)}

    played = rollouts["higher-lower"]
    assert played.error is None and played.rewards == {"found": 1.0} and played.metrics == {"guesses": 3.0, **NO_BRANCH}
    messages = [(n.role, n.content) for n in traces[played.rollout_id].nodes if n.kind == "message"]
    assert messages == [(m["role"], m["content"]) for m in game]
    turn = "\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    assert [tiny_models.tokenizer.decode(run) for run in _zero_runs(played)] == [turn.format("Higher."),
                                                                                 turn.format("Lower.")]
    assert sum(played.loss_mask) == sum(len(n.call.completion_token_ids)
                                        for n in traces[played.rollout_id].nodes if n.kind == "llm_call")

    talked = rollouts["model-user"]  # the served model said something as the user; it is not trained
    assert talked.error is None and talked.metrics == {"guesses": 2.0, **NO_BRANCH}
    said = [n.content for n in traces[talked.rollout_id].nodes if n.kind == "message" and n.role == "user"][1:]
    assert len(said) == 1
    assert [tiny_models.tokenizer.decode(run) for run in _zero_runs(talked)] == [turn.format(said[0])]


def test_eval_of_a_tool_environment_gets_the_rewards_its_training_rollouts_get(vllm_server, tiny_models,
                                                                               version_base, tmp_path):
    """The same rows, weights and greedy sampling, once as training rollouts (token ids through the
    rollout's interceptor) and once as `rollwire eval` runs them (text through the server's OpenAI
    API): the same rewards and the same answers, row for row."""
    from rollwire.core.endpoints import OpenAIEndpoint
    from rollwire.producers.environments.calculator import Calculator
    from rollwire.producers.evaluate import evaluate

    class Asked(Calculator):
        def rows(self):
            for i, question in enumerate(["What is 6 * 7?", "What is 5 * 3?", "What is 12 + 30?"]):
                yield {"task_id": f"asked-{i}", "reference": [42.0, 15.0, 42.0][i],
                       "messages": [TOOL_CONVERSATION[0], {"role": "user", "content": question}]}

    model = tiny_models.overfitted(tmp_path / "tool-caller", [TOOL_CONVERSATION], seed=5, max_loss=0.05)
    vllm_server.control.swap_full_weights(str(model), str(version_base))
    taskset = Asked()
    log, topics = fresh_log(tmp_path / "log", "same")
    send_tasks(log, topics, "calculator", list(taskset.rows()), group_size=1, max_tokens=32, temperature=0.0)
    worker = EnvWorker(log, topics, vllm_server.control, {"calculator": taskset})
    assert step_until(worker, 3, tries=120) == 3
    trained = {r.task_id: (r.rewards, r.answer) for r in read(log, topics.rollouts)}

    evaluated = evaluate(taskset, OpenAIEndpoint(f"{vllm_server.base_url}/v1", "policy"), limit=3, temperature=0.0,
                         max_tokens=32)
    assert [r.error for r in evaluated] == [None] * 3
    assert {r.task_id: r.rewards for r in evaluated} == {task: rewards for task, (rewards, _) in trained.items()}
    assert trained["asked-0"][0]["correct"] == 1.0 and trained["asked-0"][1] == "42", "it called the tool in both"
    # The same text: training stops at the template's end of turn, the server's chat API where the
    # model's generation config says, and the tiny model's says the end of a turn too, as real ones do.
    # Special tokens sampled inside a reply the chat API leaves out of its text (vLLM's default, as
    # OpenAI-compatible servers do); the rollout's text keeps them, as its harness saw them.
    from rollwire.trainer.tiny import SPECIALS
    special = re.compile("|".join(map(re.escape, SPECIALS)))
    assert {r.task_id: r.completion for r in evaluated} == {t: special.sub("", answer) for t, (_, answer) in trained.items()}
