"""The trainer on the embedded log and a local store: learning, staleness, bad input, NaN, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from builders import production
from builders import trainable as scored

from rollwire.core.bus import AtOffsets, EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.core.objectstore import LocalStore
from rollwire.schemas import Codec, DeadLetter, RolloutsDropped, Topics, TrainStepCompleted, WeightsPublished
from rollwire.trainer import checkpoint, losses
from rollwire.trainer.loop import Trainer, TrainerSettings
from rollwire.trainer.model import ModelSettings, layout, load_policy, token_logprobs
from rollwire.trainer.step import Objectives, train_step


def events(log, topic):
    with log.reader([topic]) as reader:
        out = []
        while batch := reader.poll_batch(1000, 0.3):
            out += [Codec().decode(r.value).event for r in batch if r.value is not None]
        return out


@pytest.fixture
def world(tmp_path):
    topics = Topics("train")
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    log.create_topics(catalog_topics(topics))
    return log, topics, LocalStore(tmp_path / "store")


def send_scored(log, topics, items):
    producer = EventProducer(log.producer(), topics, name="scorer")
    for s in items:
        producer.send(topics.scored, s, key=s.rollout.group_id)
    producer.close()


def settings(tmp_path, tiny_policy, **batch) -> TrainerSettings:
    return TrainerSettings(model=ModelSettings(path=str(tiny_policy)), lr=1e-3, micro_batch_rollouts=3,
                           checkpoint_dir=tmp_path / "ckpt", batch={"batch_rollouts": 4, "max_off_policy": 1, **batch})


def test_the_logprobs_from_the_completion_positions_only_equal_every_positions(tiny_policy):
    """`token_logprobs` runs the output layer from the first completion position (`logits_to_keep`);
    prompts of different lengths, and a short completion padded, give what the full logits give."""
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    rollouts = [scored(i, prompt=[1] + [7] * (3 + 4 * i)).rollout for i in range(3)]
    tokens = layout(rollouts, torch.device("cpu"))
    with torch.no_grad():
        kept = token_logprobs(model, tokens)
        logits = model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).logits
        every = torch.log_softmax(logits.float(), -1).gather(1, tokens.gather_from[..., None].expand(
            -1, -1, logits.size(-1))).gather(2, tokens.targets[..., None])[..., 0]
    assert torch.allclose(kept * tokens.mask, every * tokens.mask, atol=1e-5)
    assert len({len(r.prompt_token_ids) for r in rollouts}) == 3


def test_a_few_steps_on_a_fixed_batch_reduce_the_loss(tiny_policy):
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    batch = [scored(i) for i in range(8)]
    with torch.no_grad():  # sample-time logprobs under the same weights: ratios start at 1
        current = token_logprobs(model, layout([s.rollout for s in batch], torch.device("cpu")))
    batch = [scored(i, logprobs=current[i, : len(s.rollout.completion_token_ids)].tolist(),
                    advantage=1.0 if i % 2 else -1.0) for i, s in enumerate(batch)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = losses.build("ppo_clip", eps_low=10.0, eps_high=10.0)
    values = [train_step(model, optimizer, loss, batch, micro_batch=3, max_grad_norm=1.0,
                         device=torch.device("cpu")).loss for _ in range(5)]
    assert values[-1] < values[0] - 0.1, values


def test_a_rollouts_other_lines_train_as_their_own_sequences_with_its_advantage(tiny_policy):
    """A rollout whose template rewrote history carries its other lines (`branches = "all"`): one
    step on it moves the weights exactly as one step on its lines given as separate rollouts."""
    from rollwire.schemas import TokenSequence
    main, other = scored(0, advantage=0.7).rollout, scored(1).rollout
    line = TokenSequence(**other.model_dump(include={"prompt_token_ids", "completion_token_ids", "completion_logprobs",
                                                     "loss_mask", "weight_versions"}))
    with_branch = [scored(0, advantage=0.7).model_copy(update={"rollout": main.model_copy(update={"branches": [line]})})]
    separate = [scored(0, advantage=0.7), scored(1, advantage=0.7)]
    weights = []
    for batch in (with_branch, separate):
        torch.manual_seed(0)
        model = load_policy(ModelSettings(path=str(tiny_policy)))
        result = train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), losses.build("ppo_clip"), batch,
                            micro_batch=4, max_grad_norm=100.0, device=torch.device("cpu"))
        weights.append((result.num_tokens, [p.detach().clone() for p in model.parameters()]))
    (tokens_a, a), (tokens_b, b) = weights
    assert tokens_a == tokens_b == len(main.completion_token_ids) + len(other.completion_token_ids)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b))


def test_corrections_and_preferences_train_beside_rollouts_each_by_its_own_loss(tiny_policy):
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    cpu = torch.device("cpu")

    def logprob_sums(rollouts):
        with torch.no_grad():
            tokens = layout(rollouts, cpu)
            return (token_logprobs(model, tokens) * tokens.mask).sum(-1).tolist()

    pair = production(1, objective="preference")
    with torch.no_grad():  # the reference: what the serving policy (these weights) gave each response
        current = token_logprobs(model, layout([pair.rollout, pair.rejected], cpu))
    chosen, rejected = (r.model_copy(update={"completion_logprobs": current[i, :len(r.completion_token_ids)].tolist()})
                        for i, r in enumerate((pair.rollout, pair.rejected)))
    pair = pair.model_copy(update={"rollout": chosen, "rejected": rejected})
    correction = production(2, objective="sft")
    batch = [scored(i) for i in range(3)] + [correction, pair]
    sft_before, = logprob_sums([correction.rollout])
    chosen_before, rejected_before = logprob_sums([pair.rollout, pair.rejected])

    objectives = Objectives(losses.build("ppo_clip"), preference=losses.build("dpo", beta=0.5))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    results = [train_step(model, optimizer, objectives, batch, micro_batch=2, max_grad_norm=1.0, device=cpu)
               for _ in range(4)]

    assert {"clip_fraction", "ratio_mean", "sft_nll", "dpo_accuracy", "dpo_margin"} <= set(results[0].metrics)
    assert results[0].metrics["dpo_margin"] == pytest.approx(0.0, abs=1e-5)  # nothing moved from the reference yet
    assert results[-1].metrics["dpo_margin"] > 0 and results[-1].metrics["dpo_accuracy"] == 1.0
    assert results[-1].metrics["sft_nll"] < results[0].metrics["sft_nll"]
    chosen_after, rejected_after = logprob_sums([pair.rollout, pair.rejected])
    assert chosen_after - rejected_after > chosen_before - rejected_before
    assert logprob_sums([correction.rollout])[0] > sft_before
    assert results[0].num_tokens == sum(sum(r.loss_mask) for s in batch for r in (s.rollout, s.rejected) if r)


def test_off_policy_corrections_weigh_the_step_and_report_over_the_whole_batch(tiny_policy):
    """The same batch in one micro-batch or three reports the same shares (token means over the
    step); icepop with bounds no ratio meets masks every token, so SGD leaves the weights alone."""
    from rollwire.trainer.corrections import CorrectionSpec
    # the tiny model gives its ~100 tokens about -4.6: sampled at -8, a ratio near 30 (capped); at -2, near 0.07
    batch = [scored(i, completion=[10, 11, 12, 13], logprobs=[-8.0 if i % 2 else -2.0] * 4) for i in range(6)]
    reported = []
    for micro_batch in (6, 2):
        model = load_policy(ModelSettings(path=str(tiny_policy)))
        objectives = Objectives(losses.build("ppo_clip"), corrections=[CorrectionSpec(name="token_tis", cap=1.5),
                                                                        CorrectionSpec(name="measure")])
        result = train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), objectives, batch,
                            micro_batch=micro_batch, max_grad_norm=1.0, device=torch.device("cpu"))
        reported.append(result.metrics)
    assert reported[0]["tis_capped"] == pytest.approx(0.5) and reported[0]["ratio_mean"] > 10
    for key in ("tis_capped", "tis_weight", "ratio_mean", "ratio_abs_log_mean"):
        assert reported[1][key] == pytest.approx(reported[0][key], rel=1e-5), key
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    before = [p.detach().clone() for p in model.parameters()]
    nothing = Objectives(losses.build("ppo_clip"), corrections=[CorrectionSpec(name="icepop", lower=1e6, upper=2e6)])
    result = train_step(model, torch.optim.SGD(model.parameters(), lr=0.1), nothing, batch, micro_batch=6,
                        max_grad_norm=1.0, device=torch.device("cpu"))
    assert result.metrics["icepop_masked"] == pytest.approx(1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_a_batch_without_signal_leaves_the_optimizer_as_it_was(tiny_policy):
    """Every advantage 0 gives an exactly zero gradient: the optimizer is not stepped, so Adam's
    moments do not decay (stepped, the next small gradient would move every weight by ~3 x lr), and
    the step says so; the next batch with a signal steps as before."""
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(advantage):
        return train_step(model, optimizer, losses.build("ppo_clip"), [scored(i, advantage=advantage) for i in range(4)],
                          micro_batch=4, max_grad_norm=1.0, device=torch.device("cpu"))

    def state():
        return [(p.detach().clone(), optimizer.state[p]["exp_avg_sq"].clone(), optimizer.state[p]["step"].clone())
                for p in model.parameters()]

    assert step(1.0).metrics["no_signal"] == 0.0
    before = state()
    held = step(0.0)
    assert held.grad_norm == 0.0 and held.metrics["no_signal"] == 1.0 and held.skipped_reason is None
    assert all(torch.equal(a, b) for old, new in zip(before, state()) for a, b in zip(old, new))
    assert step(0.5).metrics["no_signal"] == 0.0
    assert not torch.equal(before[0][1], state()[0][1])


def test_a_non_finite_loss_skips_the_step_and_leaves_the_weights(tiny_policy):
    model = load_policy(ModelSettings(path=str(tiny_policy)))
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(model, torch.optim.AdamW(model.parameters()), _NanLoss(), [scored(0)], micro_batch=4,
                        max_grad_norm=1.0, device=torch.device("cpu"))
    assert result.loss is None and "step skipped" in result.skipped_reason
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


class _NanLoss(losses.Loss):
    """A loss that goes non-finite, as a diverging run's would."""

    name = "nan"

    def __call__(self, x):
        return (x.logprobs * x.mask).sum() * float("nan"), {}


def test_stale_bad_and_duplicate_rollouts_are_accounted_and_training_goes_on(world, tmp_path, tiny_policy):
    log, topics, store = world
    good = [scored(i) for i in range(8)]
    send_scored(log, topics, good[:4])
    trainer = Trainer(log, topics, store, settings(tmp_path, tiny_policy))
    assert trainer.step(timeout_s=2).policy_version == 1
    # Version 0 samples are now 1 behind (still fine); after one more step they are 2 behind: stale.
    send_scored(log, topics, good[4:] + [good[0],  # a redelivery
                                         scored(100, completion=[5, 999]),  # outside the vocabulary
                                         scored(101, mask=[0, 0, 0], completion=[5, 6, 7]),  # nothing to train
                                         scored(102, logprobs=[float("nan")] * 3, completion=[5, 6, 7])])
    assert trainer.step(timeout_s=2).step == 2
    send_scored(log, topics, [scored(200 + i) for i in range(2)] + [scored(300 + i, version=2) for i in range(4)])
    third = trainer.step(timeout_s=2)
    trainer.close()

    assert third.drops == {"stale": 2} and third.rollout_ids == [f"r{300 + i}" for i in range(4)]
    assert set(third.loss_metrics) == {"clip_fraction", "ratio_mean", "no_signal"}
    assert 0 <= third.loss_metrics["clip_fraction"] <= 1
    from rollwire.core.trackers import step_metrics
    assert step_metrics(third, 0)["loss/ratio_mean"] == third.loss_metrics["ratio_mean"]
    assert third.staleness.max == 0
    drops = [e for e in events(log, topics.drops) if isinstance(e, RolloutsDropped)]
    assert [(d.reason, d.rollout_ids, d.stage) for d in drops] == [("stale", ["r200", "r201"], "trainer")]
    letters = [e for e in events(log, topics.deadletter) if isinstance(e, DeadLetter)]
    assert sorted(letter.error.split(" ")[1] for letter in letters) == ["ids", "rollout", "sampler"]
    steps = [e for e in events(log, topics.train) if isinstance(e, TrainStepCompleted)]
    assert [s.step for s in steps] == [1, 2, 3] and all(s.loss is not None for s in steps)
    weights = [e for e in events(log, topics.weights) if isinstance(e, WeightsPublished)]
    assert [w.version for w in weights] == [1, 2, 3]
    assert store.exists("policy/v00000003/manifest.json")


def test_stale_rollouts_are_reported_at_once_when_no_batch_forms_and_once_only(world, tmp_path, tiny_policy):
    """A dispatcher waits for drops to be counted back before it issues more work: drops that
    waited for the next step could stall a run whose next batch is never issued."""
    log, topics, store = world
    send_scored(log, topics, [scored(i) for i in range(4)] + [scored(10 + i, version=1) for i in range(4)])
    trainer = Trainer(log, topics, store, settings(tmp_path, tiny_policy))
    assert trainer.step(timeout_s=2).step == 1 and trainer.step(timeout_s=2).step == 2
    send_scored(log, topics, [scored(20 + i, version=0) for i in range(3)])  # 2 behind, max_off_policy 1
    assert trainer.step(timeout_s=1) is None
    trainer.close()
    dropped = [e.rollout_ids for e in events(log, topics.drops)]
    assert dropped == [["r20", "r21", "r22"]]

    resumed = Trainer(log, topics, store, settings(tmp_path, tiny_policy))  # from the drops-only commit
    assert resumed.state.step == 2 and resumed.step(timeout_s=1) is None
    send_scored(log, topics, [scored(30 + i, version=2) for i in range(4)])
    third = resumed.step(timeout_s=2)
    resumed.close()
    assert third.step == 3 and third.drops == {} and third.rollout_ids == [f"r{30 + i}" for i in range(4)]
    assert [e.rollout_ids for e in events(log, topics.drops)] == [["r20", "r21", "r22"]], "reported once"


def test_kill_9_mid_run_then_restart_trains_every_rollout_once_or_drops_it(world, tmp_path, tiny_policy):
    log, topics, store = world
    everything = [scored(i, version=v) for v in range(6) for i in range(v * 100, v * 100 + 16)]
    send_scored(log, topics, everything)
    command = [sys.executable, "-m", "rollwire.cli", "train", "--model", str(tiny_policy), "--prefix", "train",
               "--log-dir", str(tmp_path / "log"), "--store-dir", str(tmp_path / "store"),
               "--checkpoint-dir", str(tmp_path / "ckpt"), "--batch-rollouts", "8", "--max-off-policy", "2",
               "--exit-when-idle", "3"]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len([e for e in events(log, topics.train)]) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    late = [scored(900 + i, version=0) for i in range(8)]  # three or more versions behind by now: stale
    late += [scored(950 + i, version=99) for i in range(8)]  # fresh: the step that takes them reports the drops
    send_scored(log, topics, late)
    everything += late
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]

    steps = {}
    for e in events(log, topics.train):
        assert steps.setdefault(e.step, e.rollout_ids) == e.rollout_ids, "a re-sent step must be identical"
    trained = [rid for ids in steps.values() for rid in ids]
    dropped = [rid for e in events(log, topics.drops) for rid in e.rollout_ids]
    # What the last checkpoint has not read past waits for a fuller batch: fewer than one batch.
    state = checkpoint.load_state(checkpoint.latest(tmp_path / "ckpt"))
    waiting = []
    with log.reader([topics.scored], AtOffsets(state.positions)) as reader:
        while batch := reader.poll_batch(1000, 0.5):
            waiting += [Codec().decode(r.value).event.rollout.rollout_id for r in batch]
    assert len(trained) == len(set(trained)), "no rollout is trained twice"
    assert not set(trained) & set(dropped) and not set(waiting) & (set(trained) | set(dropped))
    assert set(trained) | set(dropped) | set(waiting) == {s.rollout.rollout_id for s in everything}
    assert len(waiting) < 8 and {f"r{900 + i}" for i in range(8)} <= set(dropped)
    assert sorted(steps) == list(range(1, len(steps) + 1)) and dropped


def test_rollwire_train_reports_each_step_to_the_trackers_of_its_config(world, tmp_path, tiny_policy):
    """A run's recipe handed to `rollwire train --config`: its [telemetry] report_to gets every step,
    as the run's own trainer reports them (both start through `rollwire.trainer.entry`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    log, topics, _ = world
    send_scored(log, topics, [scored(i) for i in range(16)])
    config = tmp_path / "recipe.toml"
    config.write_text(f'[trainer]\nlr = 1e-3\n[trainer.batch]\nbatch_rollouts = 8\n'
                      f'[telemetry]\nreport_to = ["tensorboard"]\n'
                      f'[telemetry.tensorboard]\nlog_dir = "{tmp_path / "tensorboard"}"\n')
    done = subprocess.run([sys.executable, "-m", "rollwire.cli", "train", "--model", str(tiny_policy), "--config",
                           str(config), "--prefix", "train", "--log-dir", str(tmp_path / "log"), "--store-dir",
                           str(tmp_path / "store"), "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-steps", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert {e.step for e in events.Scalars("train/reward_mean")} == {1, 2}


def test_a_lora_trainer_publishes_adapter_versions_and_resumes(world, tmp_path, tiny_policy):
    log, topics, store = world
    send_scored(log, topics, [scored(i) for i in range(8)])
    lora = TrainerSettings(model=ModelSettings(path=str(tiny_policy), lora={"rank": 4, "target_modules": ["q_proj"]}),
                           lr=1e-2, checkpoint_dir=tmp_path / "ckpt", batch={"batch_rollouts": 4})
    trainer = Trainer(log, topics, store, lora)
    trainer.step(timeout_s=2)
    adapter = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" in k}
    trainer.close()

    resumed = Trainer(log, topics, store, lora)
    assert resumed.state.step == 1
    assert all(torch.equal(v, resumed.model.state_dict()[k]) for k, v in adapter.items())
    resumed.step(timeout_s=2)
    resumed.close()
    weights = [e for e in events(log, topics.weights) if isinstance(e, WeightsPublished)]
    assert [(w.version, w.format) for w in weights] == [(1, "lora"), (2, "lora")]
    assert store.exists("policy/v00000002/adapter_model.safetensors")
    assert adapter and all("q_proj" in k for k in adapter)


def test_the_cpu_path_is_deterministic(tiny_policy):
    def trained() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = load_policy(ModelSettings(path=str(tiny_policy), device="cpu"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(2):
            train_step(model, optimizer, losses.build("ppo_clip"), [scored(i) for i in range(6)], micro_batch=4,
                       max_grad_norm=1.0, device=torch.device("cpu"))
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(trained(), trained()))


def test_the_store_keeps_what_retention_and_the_fleet_need_and_a_pruned_version_is_refused(world, tmp_path,
                                                                                           tiny_policy):
    from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
    from rollwire.core.weight_versions import CheckpointMissingError, stored_version, stored_versions
    from rollwire.producers.releases import promote
    from rollwire.schemas import ReplicaStatus
    log, topics, store = world
    fleet = EventProducer(log.producer(), topics, name="replica")
    fleet.send(topics.fleet, ReplicaStatus(replica_id="r0", state="serving", serving_version=2, url="http://r0"),
               key="r0")  # a replica still serves version 2 (it never reports again)
    fleet.flush()
    trainer = Trainer(log, topics, store, TrainerSettings.model_validate(
        {**settings(tmp_path, tiny_policy).model_dump(), "retention": {"keep_last": 2, "keep_every": 4}}))
    published = {}
    for step in range(1, 10):
        send_scored(log, topics, [scored(10 * step + i, version=step - 1) for i in range(4)])
        assert trainer.step(timeout_s=5).policy_version == step
        published[step] = stored_version(store, "policy", step) if step in stored_versions(store, "policy") else None
        if step == 3:
            promote(log, topics, store, policy="policy", version=3)  # production serves version 3
            time.sleep(1.5)  # the trainer's follower reads the decision
    trainer.close()

    assert stored_versions(store, "policy") == [2, 3, 4, 8, 9]  # served, decided, every 4th, the last 2
    assert store.list("policy/v00000005/") == []  # files gone too, not only the manifest
    with pytest.raises(CheckpointMissingError, match="pruned by the trainer's retention.*holds 2-4, 8-9"):
        stored_version(store, "policy", 5)

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the engine was touched ({name})")

    subscriber = WeightSubscriber(log, topics, store, Untouchable(), WeightSubscriberSettings(
        replica_id="late", cache_dir=tmp_path / "cache"))
    status = subscriber.apply(published[5])  # a replica that asks late for version 5
    assert status.state == "failed" and "pruned" in status.reason
    subscriber.close()


def test_bfloat16_weights_are_published_as_snapshots_and_deltas_that_rebuild_each_version(world, tmp_path,
                                                                                          tiny_policy):
    """At a fine-tuning learning rate most bfloat16 elements keep their bits: the versions between
    snapshots are stored as deltas, and each rebuilds, from the store alone, the trainer's weights."""
    from rollwire.core.weight_versions import fetch
    from rollwire.trainer.model import save_model
    log, topics, store = world
    config = TrainerSettings.model_validate({**settings(tmp_path, tiny_policy).model_dump(), "lr": 1e-5,
                                             "snapshot_every": 3, "model": {"path": str(tiny_policy),
                                                                            "dtype": "bfloat16"}})
    trainer = Trainer(log, topics, store, config)
    for step in range(1, 5):
        send_scored(log, topics, [scored(10 * step + i, version=step - 1) for i in range(4)])
        assert trainer.step(timeout_s=5).policy_version == step
        save_model(trainer.model, tmp_path / f"trainer-v{step}")
    trainer.close()
    resumed = Trainer(log, topics, store, config)  # a new process: its first version is whole
    send_scored(log, topics, [scored(50 + i, version=4) for i in range(4)])
    assert resumed.step(timeout_s=5).policy_version == 5
    save_model(resumed.model, tmp_path / "trainer-v5")
    resumed.close()

    weights = [e for e in events(log, topics.weights) if isinstance(e, WeightsPublished)]
    assert [(w.version, w.encoding, w.base_version) for w in weights] == [
        (1, "snapshot", None), (2, "delta", 1), (3, "delta", 2), (4, "snapshot", None), (5, "snapshot", None)]
    assert all(w.size_bytes == w.full_size_bytes for w in weights if w.encoding == "snapshot")
    assert all(w.size_bytes < 0.2 * w.full_size_bytes for w in weights if w.encoding == "delta"), weights
    assert weights[1].base_manifest_sha256 == weights[0].manifest_sha256
    versions = [(tmp_path / f"trainer-v{v}/model.safetensors").read_bytes() for v in range(1, 6)]
    assert len(set(versions)) == 5, "every step changed some bits: each delta has something to rebuild"
    for w in weights:
        fetch(store, w.uri, w.manifest_sha256, tmp_path / f"replica-v{w.version}")
        assert (tmp_path / f"replica-v{w.version}/model.safetensors").read_bytes() == \
            (tmp_path / f"trainer-v{w.version}/model.safetensors").read_bytes()
    assert [p.name for p in (tmp_path / "ckpt/published").iterdir()] == ["v00000005"]  # the next delta's base only
