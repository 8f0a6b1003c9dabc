"""The container runtime on a real Docker engine and a real vLLM server: an agent in its rollout's
container reaches the model through its URL and nothing else; one that reaches for the network,
fork-bombs, fills memory or hangs ends as an errored rollout with the reason, and the worker goes on
to the next. Nothing is left running."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_engine import engine_with_images

from rollwire.consumers.vllm_control import VllmControl
from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.producers.assembly import assemble
from rollwire.producers.env_worker import EnvWorker, EnvWorkerSettings
from rollwire.producers.harnesses import HarnessError
from rollwire.producers.interception import Interceptor
from rollwire.producers.routing import Router
from rollwire.producers.sandbox import OWNER_LABEL, Container, ContainerSettings
from rollwire.producers.tasksets import RolloutView, Taskset, load_taskset, metric, reward
from rollwire.schemas import Codec, SamplingParams, TaskAssigned, Topics

pytestmark = [pytest.mark.container, pytest.mark.slow, pytest.mark.timeout(900)]

AGENT = Path(__file__).resolve().parent.parent / "data" / "sandbox" / "agent.py"
GRADER = AGENT.with_name("grade.py")
IMAGE = "local/python:3.11"


@pytest.fixture(scope="module")
def agents(tmp_path_factory) -> Iterator[Path]:
    """A folder the container's unprivileged user can read, holding the test's agent."""
    with engine_with_images(["debian", "python"], "the container runtime test"):
        folder = tmp_path_factory.mktemp("agents")
        folder.chmod(0o755)
        for program in (AGENT, GRADER):
            shutil.copy(program, folder / program.name)
            (folder / program.name).chmod(0o644)
        yield folder


def settings(agents: Path, **limits) -> ContainerSettings:
    return ContainerSettings(image=IMAGE, command=["python3", "/agents/agent.py"], mounts=[f"{agents}:/agents"],
                             **limits)


def work(worker: EnvWorker, log, topics: Topics, rollouts: int) -> tuple[int, dict]:
    """Steps `worker` until it has published `rollouts` (a minute at most), closes it and the log;
    returns how many it published and the rollouts by task id."""
    try:
        published = 0
        for _ in range(60):
            published += worker.step(timeout_s=1.0)
            if published == rollouts:
                break
    finally:
        worker.close()
    found = {}
    with log.reader([topics.rollouts]) as reader:
        while batch := reader.poll_batch(100, 0.5):
            found.update({e.task_id: e for e in (Codec().decode(r.value).event for r in batch)})
    log.close()
    return published, found


def left_running() -> list[str]:
    """The containers of runtimes in this test process (a whole run in the other pytest worker may
    have its own running meanwhile)."""
    owner = f"{socket.gethostname()}:{os.getpid()}"
    return subprocess.run(["docker", "ps", "-aq", "--filter", f"label={OWNER_LABEL}={owner}"], capture_output=True,
                          text=True, check=True).stdout.split()


@pytest.mark.vllm
def test_an_agent_in_its_container_reaches_the_model_through_its_url_alone(agents, vllm_server, tiny_models,
                                                                          version_base):
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    runtime = Container(settings(agents))
    try:
        interceptor = Interceptor(vllm_server.control, SamplingParams(temperature=1.0, max_tokens=6))
        answer = runtime.run("unused", {"prompt": "r:123>", "behave": "answer"}, interceptor, timeout_s=60)
        assert len(interceptor.calls) == 1, "the agent's one call was recorded by its rollout's interceptor"
        call = interceptor.calls[0]
        shown = call.completion_token_ids[:-1] if call.finish_reason == "stop" else call.completion_token_ids
        recorded = vllm_server.control.detokenize(shown) if shown else ""  # less the end-of-text it stopped on
        assert answer.strip() == recorded.strip()

        interceptor = Interceptor(vllm_server.control, SamplingParams(temperature=1.0, max_tokens=6))
        with pytest.raises(Exception, match="no network: only the rollout's model URL answers") as refused:
            runtime.run("unused", {"prompt": "r:9>", "behave": "network"}, interceptor, timeout_s=60)
        assert "Network is unreachable" in str(refused.value)
        assert len(interceptor.calls) == 1, "the model URL answered before the network was refused"
    finally:
        runtime.close()
    assert not left_running()


@pytest.mark.vllm
def test_hostile_agents_end_as_errored_rollouts_and_the_worker_goes_on(tmp_path, agents, vllm_server, tiny_models,
                                                                       version_base):
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    topics = Topics("sandbox")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    behaviours = ["fork", "memory", "hang", "network", "answer"]
    for behave in behaviours:
        producer.send(topics.tasks, TaskAssigned(task_id=behave, environment="reverse-digits", algorithm="grpo",
                                                 group_size=1, task={"prompt": "r:12>", "answer": "21",
                                                                     "behave": behave},
                                                 policy_version=0), key=behave)
    producer.close()
    worker_settings = EnvWorkerSettings(runtime="container", rollout_timeout_s=20, concurrency=5,
                                        container=settings(agents, memory_mb=96, pids=32))
    worker = EnvWorker(log, topics, Router.single(vllm_server.control), {
        "reverse-digits": load_taskset("reverse-digits", count=1)}, worker_settings)
    published, rollouts = work(worker, log, topics, len(behaviours))
    assert published == len(behaviours) and sorted(rollouts) == sorted(behaviours)
    errors = {task: (r.error.kind, r.error.message) if r.error else None for task, r in rollouts.items()}
    assert errors["fork"][0] == "resource_limit" and "limit of 32 processes" in errors["fork"][1], errors
    assert errors["memory"][0] == "resource_limit" and "out of memory" in errors["memory"][1], errors
    assert errors["hang"][0] == "timeout" and "20 s" in errors["hang"][1], errors
    assert errors["network"][0] == "harness_crash" and "no network" in errors["network"][1], errors
    assert errors["answer"] is None and rollouts["answer"].completion_token_ids, "the worker went on to a good rollout"
    assert not left_running()


def test_an_image_that_is_not_there_is_refused_with_how_to_build_one(agents):
    with pytest.raises(ValueError, match="images.py"):
        Container(ContainerSettings(image="local/no-such-image:1"))


def test_a_dead_workers_containers_are_removed_by_the_next_runtime(agents):
    import socket
    orphan = subprocess.run(["docker", "run", "-d", "--label", f"{OWNER_LABEL}={socket.gethostname()}:999999999",
                             IMAGE, "sleep", "600"], capture_output=True, text=True, check=True).stdout.strip()
    runtime = Container(settings(agents))
    runtime.close()
    gone = subprocess.run(["docker", "inspect", orphan], capture_output=True, text=True)
    assert gone.returncode != 0, "the dead worker's container is still there"
    assert not left_running()


def test_closing_removes_a_running_rollouts_container_and_starts_none_after(agents):
    """A worker that stops with a rollout still running (its drain over) closes the runtime: the
    running container is removed and its rollout fails, a waiting pool container is retired, and
    a rollout that arrives after the close starts no container."""
    import threading
    runtime = Container(settings(agents, warm=1))
    interceptor = Interceptor(VllmControl("http://127.0.0.1:9"), SamplingParams())
    outcome: list[BaseException | str] = []

    def hanging_rollout() -> None:
        try:
            outcome.append(runtime.run("unused", {"behave": "hang"}, interceptor, timeout_s=600))
        except BaseException as exc:  # noqa: BLE001 - the test reads what ended it
            outcome.append(exc)

    thread = threading.Thread(target=hanging_rollout)
    thread.start()
    deadline = time.monotonic() + 60
    while len(left_running()) < 2:  # the hanging rollout's container and the pool's next one
        assert time.monotonic() < deadline, "the rollout's and the pool's containers did not start"
        time.sleep(0.2)
    runtime.close()
    thread.join(timeout=60)
    assert not thread.is_alive() and isinstance(outcome[0], HarnessError), outcome
    assert not left_running()
    with pytest.raises(HarnessError, match="stopping"):
        runtime.run("unused", {"behave": "give-up"}, interceptor, timeout_s=30)
    assert not left_running()


class Repair(Taskset):
    """Rewarded by the tests a grading command runs in the rollout's own container."""

    name = "repair"

    def rows(self):
        yield from ()

    @reward("tests_pass")
    def tests_pass(self, r: RolloutView) -> float:
        return float(r.sandbox is not None and r.sandbox["returncode"] == 0 and "1 passed" in r.sandbox["stdout"])

    @metric("grader_saw_the_answer")
    def grader_saw_the_answer(self, r: RolloutView) -> float:
        return float(r.sandbox is not None and f"answer: {r.completion}" in r.sandbox["stdout"])


def test_a_reward_sees_what_a_grading_command_found_in_the_rollouts_container(tmp_path, agents):
    """The agents work without the model (the route is never called): one leaves a working file in
    its container, one leaves none; the grading command tests the file in the same container,
    after the agent and before the container is removed."""
    topics = Topics("graded")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="dispatcher")
    for behave in ("repair", "give-up"):
        producer.send(topics.tasks, TaskAssigned(task_id=behave, environment="repair", algorithm="grpo", group_size=1,
                                                 task={"behave": behave}, policy_version=0), key=behave)
    producer.close()
    container = settings(agents, grade_command=["python3", "/agents/grade.py"], grade_timeout_s=30)
    worker = EnvWorker(log, topics, Router.single(VllmControl("http://127.0.0.1:9")), {"repair": Repair()},
                       EnvWorkerSettings(runtime="container", rollout_timeout_s=30, concurrency=2, container=container))
    published, rollouts = work(worker, log, topics, 2)
    assert published == 2 and {task: (r.error, r.rewards) for task, r in rollouts.items()} == {
        "repair": (None, {"tests_pass": 1.0}), "give-up": (None, {"tests_pass": 0.0})}
    assert rollouts["repair"].answer == "fixed"
    assert [r.metrics["grader_saw_the_answer"] for r in rollouts.values()] == [1.0, 1.0]
    assert not left_running()


def test_a_warm_pools_containers_wait_started_and_each_serves_one_rollout(agents):
    """Two containers wait started before any rollout; a rollout takes one and another starts; the
    file one rollout left is not in the next one's container (each is used once); none is left."""
    runtime = Container(settings(agents, grade_command=["python3", "/agents/grade.py"], warm=2))
    try:
        deadline = time.monotonic() + 60
        while len(left_running()) < 2:
            assert time.monotonic() < deadline, "the pool's two containers did not start"
            time.sleep(0.2)
        first = left_running()
        graded = []
        for behave in ("repair", "give-up", "give-up"):
            interceptor = Interceptor(VllmControl("http://127.0.0.1:9"), SamplingParams())
            runtime.run("unused", {"behave": behave}, interceptor, timeout_s=30)
            graded.append(interceptor.grading["stdout"].splitlines()[-1])
        assert graded == ["1 passed", "1 failed", "1 failed"], "a rollout saw the file an earlier one left"
        while set(first) & set(left_running()):  # used ones are removed in the background
            assert time.monotonic() < deadline + 30, "a waiting container served more than one rollout"
            time.sleep(0.2)
    finally:
        runtime.close()
    assert not left_running()


@pytest.mark.vllm
def test_eval_runs_a_container_environment_as_training_does_graded_inside(vllm_server, tiny_models, version_base):
    """`rollwire eval` of examples/environments/graded_reversal.py: its agent program in a container
    per answer, reaching the evaluated endpoint through the rollout's socket alone, graded in the
    container; the reward is the grader's verdict and agrees with the same check made outside."""
    from rollwire.core.endpoints import OpenAIEndpoint
    from rollwire.producers.environment import EnvironmentSetup
    from rollwire.producers.evaluate import evaluate
    vllm_server.control.swap_full_weights(str(tiny_models.base), str(version_base))
    examples = Path(__file__).resolve().parents[2] / "examples" / "environments"
    taskset = load_taskset(f"{examples / 'graded_reversal.py'}:GradedReversal", seed=4)
    setup = EnvironmentSetup(agent_command=["python3", "/agents/reverse.py"], runtime="container",
                             container=ContainerSettings(image=IMAGE, mounts=[f"{examples / 'agents'}:/agents"],
                                                         grade_command=["python3", "/agents/check.py"]))
    results = evaluate(taskset, OpenAIEndpoint(f"{vllm_server.base_url}/v1", "policy"), limit=4, max_tokens=8,
                       setup=setup, concurrency=2)
    assert all(r.error is None for r in results), [r.error for r in results]
    assert all(r.rewards["graded_correct"] == r.metrics["answer_matches"] for r in results), results

    class Knowing:
        """An endpoint that knows the task: answers each prompt `...r:DIGITS>` with the reversal."""

        def post(self, path: str, body: dict) -> dict:
            digits = body["prompt"].rsplit("r:", 1)[1].rstrip(">")
            return {"choices": [{"text": digits[::-1], "finish_reason": "stop"}], "usage": {"completion_tokens": 2}}

    knew = evaluate(taskset, Knowing(), limit=3, setup=setup, concurrency=1)  # type: ignore[arg-type]
    assert [(r.error, r.rewards["graded_correct"]) for r in knew] == [(None, 1.0)] * 3
    assert not left_running()


MINI_SWE_AGENT = Path(__file__).resolve().parents[2] / "examples" / "agents" / "mini_swe_agent"


@pytest.mark.vllm
def test_mini_swe_agent_solves_a_task_in_its_container_recorded_token_for_token(agents, vllm_server, tiny_models,
                                                                                tmp_path, version_base):
    """mini-swe-agent, unmodified (its agent loop, bash environment and litellm model, from
    `examples/agents/mini_swe_agent/`), in a rollout's container with no network: it calls its bash
    tool through the rollout's URL, writes a file, submits; a grading command in the same container
    reads the file. The model is a tiny one trained here on that conversation as vLLM renders it.
    Each call's completion is what a direct generate call gives at temperature 0; the calls form
    one token sequence, the command outputs masked."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("mini_swe_install", MINI_SWE_AGENT / "install.py")
    installer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installer)
    site = installer.install()  # `make test` installed it; here it is found
    bash = {"type": "function", "function": {"name": "bash", "description": "Execute a bash command", "parameters": {
        "type": "object", "properties": {"command": {"type": "string", "description": "The bash command to execute"}},
        "required": ["command"]}}}
    task = "Write 6*7 to answer.txt"
    turns = ['<tool_call>{"name": "bash", "arguments": {"command": "echo 42 > answer.txt"}}</tool_call>',
             "<returncode>0</returncode>\n<output>\n</output>",
             '<tool_call>{"name": "bash", "arguments": {"command": '
             '"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\ncat answer.txt"}}</tool_call>']
    system = "Use the bash tool. To finish, run echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT and print the answer."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task},
                *({"role": "assistant" if i % 2 == 0 else "tool", "content": t} for i, t in enumerate(turns))]
    model = tiny_models.overfitted(tmp_path / "swe", sequences=[vllm_server.control.render_chat(messages, tools=[bash])],
                                   seed=5, max_loss=0.02)
    vllm_server.control.swap_full_weights(str(model), str(version_base + 5))
    shutil.copy(MINI_SWE_AGENT / "agent.py", agents / "mini_swe_agent.py")
    (agents / "mini_swe_agent.py").chmod(0o644)
    runtime = Container(ContainerSettings(
        image=IMAGE, command=["python3", "/agents/mini_swe_agent.py"], memory_mb=1024, pids=128, warm=0,
        mounts=[f"{agents}:/agents", f"{site}:/opt/mini-swe-agent"],
        grade_command=["sh", "-c", "cat /tmp/work/answer.txt"]))
    try:
        interceptor = Interceptor(vllm_server.control, SamplingParams(temperature=0.0, max_tokens=160))
        try:
            answer = runtime.run("unused", {"prompt": task, "system": system}, interceptor, timeout_s=120)
        except Exception as exc:
            said = [vllm_server.control.detokenize(c.prompt_token_ids + c.completion_token_ids) for c in interceptor.calls]
            raise AssertionError(f"{exc}; the calls: {said}") from exc
    finally:
        runtime.close()

    assert answer.strip() == "42" and interceptor.grading["stdout"].strip() == "42"
    calls = interceptor.calls
    end = vllm_server.control.end_of_turn_ids()
    assert [vllm_server.control.detokenize(c.completion_token_ids) for c in calls] == \
        [turns[0] + "<|im_end|>", turns[2] + "<|im_end|>"]
    for call in calls:
        direct = vllm_server.control.generate(call.prompt_token_ids, max_tokens=160, temperature=0.0, stop_token_ids=end)
        assert direct["choices"][0]["token_ids"] == call.completion_token_ids
        assert direct["choices"][0]["logprobs"]["content"][0]["logprob"] == pytest.approx(call.completion_logprobs[0],
                                                                                          abs=1e-4)
    record = assemble(calls)
    assert record.branches == [0, 0], "a call did not extend the tokens sampled before it"
    masked = vllm_server.control.detokenize([t for t, m in zip(record.completion_token_ids, record.loss_mask) if not m])
    assert "<returncode>0</returncode>" in masked and sum(record.loss_mask) == sum(len(c.completion_token_ids)
                                                                                 for c in calls)
    assert not left_running()
