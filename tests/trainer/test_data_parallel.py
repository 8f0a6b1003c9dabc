"""The trainer under torchrun: two ranks (gloo on CPU) train the same recorded batches to the same
weights as one process, publishing once per step; a rank `kill -9`ed mid-run restarts with the
others from the last commit point, and every rollout is still trained once or dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from builders import trainable as scored
from safetensors.torch import load_file

from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
from rollwire.schemas import Codec, Topics

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = """
[trainer]
lr = 1e-3
micro_batch_rollouts = 3
[trainer.batch]
batch_rollouts = 8
max_off_policy = 10
"""


def trainer_command(tmp_path: Path, tiny_policy: Path, prefix: str, ranks: int) -> list[str]:
    config = tmp_path / "trainer.toml"
    config.write_text(CONFIG)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                "--max-restarts=2", "-m"] if ranks > 1 else [sys.executable, "-m"]
    return launcher + ["rollwire.cli", "train", "--model", str(tiny_policy), "--config", str(config), "--prefix", prefix,
                       "--log-dir", str(tmp_path / "log"), "--store-dir", str(tmp_path / f"store-{prefix}"),
                       "--checkpoint-dir", str(tmp_path / f"ckpt-{prefix}"), "--exit-when-idle", "4"]


def process_tree(pid: int) -> str:
    """Each process under `pid`: its state, CPU time and command line."""
    lines = []
    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        try:
            with p.oneshot():
                lines.append(f"  {p.pid} {p.status()} cpu {sum(p.cpu_times()[:2]):.1f}s rank "
                             f"{p.environ().get('RANK', '-')}: {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            continue
    return "\n".join(lines)


def events(log, topic: str) -> list:
    with log.reader([topic]) as reader:
        out = []
        while batch := reader.poll_batch(1000, 0.3):
            out += [Codec().decode(r.value).event for r in batch if r.value is not None]
        return out


def record(log, topics: Topics, items) -> None:
    log.create_topics(catalog_topics(topics))
    producer = EventProducer(log.producer(), topics, name="scorer")
    for s in items:
        producer.send(topics.scored, s, key=s.rollout.group_id)
    producer.close()


def weights(store: Path, version: int) -> dict[str, torch.Tensor]:
    files = list((store / "policy" / f"v{version:08d}").glob("*.safetensors"))
    assert files, f"version {version} was not published in {store}"
    return {k: v for f in files for k, v in load_file(f).items()}


def test_two_ranks_train_the_recorded_batches_to_the_weights_one_process_does(tmp_path, tiny_policy):
    recorded = [scored(i, version=v, advantage=(-1.0) ** i * (1 + i % 3)) for v in range(3)
                for i in range(v * 100, v * 100 + 16)]
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    record(log, Topics("one"), recorded)
    record(log, Topics("two"), recorded)
    one = subprocess.run(trainer_command(tmp_path, tiny_policy, "one", 1), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(trainer_command(tmp_path, tiny_policy, "two", 2), capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]

    steps_one, steps_two = events(log, "one.train"), events(log, "two.train")
    assert [s.rollout_ids for s in steps_two] == [s.rollout_ids for s in steps_one] and len(steps_one) == 6
    assert [s.loss for s in steps_two] == pytest.approx([s.loss for s in steps_one], rel=1e-4)
    assert [s.num_tokens for s in steps_two] == [s.num_tokens for s in steps_one]
    published = [e.version for e in events(log, "two.weights")]
    assert published == list(range(1, 7)), "rank 0 publishes once per step"
    worst = 0.0
    for version in published:
        a, b = weights(tmp_path / "store-one", version), weights(tmp_path / "store-two", version)
        assert a.keys() == b.keys()
        worst = max(worst, *((a[k] - b[k]).abs().max().item() for k in a))
    print(f"largest difference between 1-rank and 2-rank weights over {len(published)} versions: {worst:.2e}")
    assert worst < 1e-4
    log.close()


def test_a_rank_killed_mid_run_restarts_with_the_others_and_every_rollout_is_accounted(tmp_path, tiny_policy):
    recorded = [scored(i, version=v) for v in range(6) for i in range(v * 100, v * 100 + 16)]
    log = open_log(EmbeddedBusSettings(path=tmp_path / "log"))
    topics = Topics("dp")
    record(log, topics, recorded)
    output = tmp_path / "torchrun.log"  # a file, not a pipe: nobody reads a pipe while the ranks write
    launcher = subprocess.Popen(trainer_command(tmp_path, tiny_policy, "dp", 2), stdout=open(output, "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "ckpt-dp" / "step-00000003").exists():
            assert time.monotonic() < deadline and launcher.poll() is None, output.read_text()[-3000:]
            time.sleep(0.05)
        ranks = [p for p in psutil.Process(launcher.pid).children(recursive=True)
                 if "rollwire.cli" in " ".join(p.cmdline())]
        rank1 = next(p for p in ranks if p.environ().get("RANK") == "1")
        os.kill(rank1.pid, signal.SIGKILL)
        try:
            code = launcher.wait(timeout=420)
        except subprocess.TimeoutExpired:  # say where it hangs: each process left, and the log's end
            raise AssertionError(f"torchrun did not finish 420 s after rank 1 was killed; processes:\n"
                                 f"{process_tree(launcher.pid)}\n{output.read_text()[-6000:]}") from None
        assert code == 0, output.read_text()[-3000:]
    finally:  # torchrun starts each rank in a session of its own: end the whole tree
        if launcher.poll() is None:
            for p in psutil.Process(launcher.pid).children(recursive=True):
                p.kill()
            os.killpg(launcher.pid, signal.SIGKILL)
    log_text = output.read_text()
    assert "failed (exitcode: -9) local_rank: 1" in log_text and "resuming at step" in log_text, log_text[-3000:]

    steps: dict[int, list[str]] = {}
    for e in events(log, topics.train):
        assert steps.setdefault(e.step, e.rollout_ids) == e.rollout_ids, "a re-sent step must be identical"
    trained = [rid for ids in steps.values() for rid in ids]
    dropped = [rid for e in events(log, topics.drops) for rid in e.rollout_ids]
    assert len(trained) == len(set(trained)), "no rollout is trained twice"
    assert not set(trained) & set(dropped)
    assert set(trained) | set(dropped) == {s.rollout.rollout_id for s in recorded}
    assert sorted(steps) == list(range(1, len(steps) + 1))
    versions = [e.version for e in events(log, topics.weights)]
    assert versions == sorted(set(versions)), "published versions strictly increase"
    log.close()
