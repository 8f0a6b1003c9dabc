"""Many faults in one run: `rollwire run --bus kafka` while every component is `kill -9`ed at a
random moment and the Kafka broker goes away for 20-30 s; then the run's accounts, from its
events alone.

    python bench/chaos.py [--steps 40] [--seed 0] [--gap 2] [--json FILE] [--keep]

It starts its own broker (deploy/kafka/broker.py, on loopback) and a short recipe (the whole-run
benchmarks' `bench/env_bound.py`): a tiny model on reverse-digits, environments taking ~20 ms,
one inference replica, two env workers, one trainer. The faults come in a random
order (`--seed`), one at a time: each waits until the run has made `--gap` more steps since the
last one, then a random 0-2 s more, then

    dispatcher, env-worker-0, env-worker-1, scorer, trainer, replica   kill -9 (the supervisor restarts it)
    vllm                                kill -9 of the vLLM API server (the replica restarts it)
    broker                              kill -9 of the broker; 20-30 s later started again on its data

A run on an idle machine can step faster than its components come back: once it is two steps from
its end with a fault still to come or to recover from, and always while the last fault fires and
recovers, the trainer is held (SIGSTOP; the rest of the run goes on), so that the last fault too is
survived with steps still to train (the time held is printed; a trainer that waited on rollouts can
make three steps in a moment, which once ended a run before its last fault came back). The run
must then finish its steps by itself. From the
events (`rollwire inspect run`'s ledger): every dispatched rollout trained exactly once, dropped
with a reason, or in flight at the end; no step number twice; published versions strictly
increasing; the replica on the newest version.
Printed: the faults with how long each component took to come back, the restarts per component
(the supervisor's, and the replica's of vLLM), the ledger. The last line is `RESULT ...`; the
exit status is 0 only when every fault fired, the run finished and every promise was kept.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "deploy" / "kafka"))
import broker as local_broker  # noqa: E402
from env_bound import env_bound_recipe  # noqa: E402
from soak import components  # noqa: E402

COMPONENTS = ("dispatcher-0", "env-worker-0", "env-worker-1", "scorer-0", "trainer-0", "replica-0", "vllm-0")
FAULTS = (*COMPONENTS, "broker")



class Chaos:
    """One run, its faults, and what they did."""

    def __init__(self, folder: Path, steps: int, seed: int, gap: int, outage: tuple[float, float]) -> None:
        self.folder, self.steps, self.gap, self.outage = folder, steps, gap, outage
        self.rng = random.Random(seed)
        self.name = f"chaos{int(time.time()) % 10**6}"
        self.run_dir = folder / "run"
        self.metrics = self.run_dir / "metrics.jsonl"
        self.broker = local_broker.start(folder / "broker")
        self.faults: list[dict] = []
        self.run: subprocess.Popen | None = None
        self.held: list[psutil.Process] = []
        self.held_since: float | None = None
        self.held_s = 0.0

    def start(self) -> None:
        recipe = self.folder / f"{self.name}.toml"
        # the whole-run benchmarks' recipe, environments a little slow (median 20 ms), one step
        # behind at most, two env workers: every kind of component, each one of its role
        recipe.write_text(env_bound_recipe(name=self.name, steps=self.steps, scale=0.02, workers=2, max_off_policy=1))
        command = [sys.executable, "-m", "rollwire", "run", str(recipe), "--run-dir", str(self.run_dir),
                   "--bus", "kafka", "--bootstrap", self.broker.bootstrap]
        self.run = subprocess.Popen(command, stdout=open(self.folder / "run.out", "w"), stderr=subprocess.STDOUT,
                                    env={**os.environ, "COLUMNS": "200"},
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def steps_done(self) -> int:
        return len(self.metrics.read_text().splitlines()) if self.metrics.exists() else 0

    def wait_for_steps(self, steps: int, timeout_s: float = 900) -> None:
        deadline = time.monotonic() + timeout_s
        while self.steps_done() < steps:
            if self.hold_near_the_end():
                return  # the trainer is held: no more steps until the faults are over
            if self.run.poll() is not None:
                raise SystemExit(f"rollwire run ended (code {self.run.returncode}) before step {steps}; "
                                 f"see {self.folder / 'run.out'}")
            if time.monotonic() > deadline:
                raise SystemExit(f"no step {steps} within {timeout_s:.0f} s; see {self.folder / 'run.out'}")
            time.sleep(0.5)

    def hold_near_the_end(self) -> bool:
        """Holds the trainer once the run is two steps from its end while faults are still under
        way; True while it is held."""
        if self.held_since is None and self.steps_done() >= self.steps - 2:
            self.hold()
        return self.held_since is not None

    def hold(self) -> None:
        """Stops the trainer (SIGSTOP, with its ranks) until `release`."""
        trainer = self.processes().get("trainer-0")
        if self.held_since is not None or trainer is None:
            return
        with contextlib.suppress(psutil.Error):
            self.held = [trainer, *trainer.children(recursive=True)]
        for process in self.held:
            with contextlib.suppress(psutil.Error):
                process.suspend()
        self.held_since = time.monotonic()
        print(f"the trainer is held at step {self.steps_done()} until the faults are over", flush=True)

    def release(self) -> None:
        """Lets a held trainer go on (one killed meanwhile was restarted unheld)."""
        if self.held_since is None:
            return
        for process in self.held:
            with contextlib.suppress(psutil.Error):
                process.resume()
        self.held_s += time.monotonic() - self.held_since
        self.held, self.held_since = [], None
        print(f"the trainer goes on after {self.held_s:.0f} s held", flush=True)

    def processes(self) -> dict[str, psutil.Process]:
        """The process each fault kills: a component, or (vllm-N) replica N's vLLM API server."""
        found = {}
        for name, procs in components(psutil.Process(self.run.pid)).items():
            if name.startswith("vllm-"):
                procs = [p for p in procs if _is_vllm_api(p)]
            if procs:
                found[name] = procs[0]
        return found

    def fire(self, fault: str) -> dict:
        at_step = self.steps_done()
        if fault == "broker":
            os.kill(self.broker.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.broker.pid, 0)
            down_s = self.rng.uniform(*self.outage)
            back_at = time.monotonic() + down_s
            while time.monotonic() < back_at:
                self.hold_near_the_end()
                time.sleep(min(0.2, max(0.0, back_at - time.monotonic())))
            self.broker = local_broker.start_again(Path(self.broker.run_dir))
            return {"fault": fault, "at_step": at_step, "down_s": round(down_s, 1)}
        victim = self.processes().get(fault)
        if victim is None:
            raise SystemExit(f"no {fault} process under rollwire run to kill")
        killed_at = time.monotonic()
        victim.kill()
        deadline = killed_at + 300
        while (back := self.processes().get(fault)) is None or back.pid == victim.pid:
            if self.run.poll() is not None:
                raise SystemExit(f"the run ended (code {self.run.returncode}, step {self.steps_done()} of "
                                 f"{self.steps}) before {fault} came back: give the faults room with more --steps; "
                                 f"see {self.folder / 'run.out'}")
            if time.monotonic() > deadline:
                raise SystemExit(f"{fault} did not come back within 300 s; see {self.folder / 'run.out'}")
            self.hold_near_the_end()
            time.sleep(0.2)
        return {"fault": fault, "at_step": at_step, "back_after_s": round(time.monotonic() - killed_at, 1)}

    def play(self) -> None:
        order = list(FAULTS)
        self.rng.shuffle(order)
        self.wait_for_steps(1)
        for fault in order:
            self.wait_for_steps(self.steps_done() + self.gap)
            time.sleep(self.rng.uniform(0, 2))
            if fault == order[-1]:
                # a trainer that waited on rollouts can make several steps at once, past the
                # two-step margin before anyone looks: the last fault is always survived held
                self.hold()
            record = self.fire(fault)
            self.faults.append(record)
            print(f"fault {len(self.faults)}/{len(order)}: {_describe(record)}", flush=True)
        self.release()

    def finish(self, timeout_s: float = 900) -> int:
        try:
            return self.run.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.run.send_signal(signal.SIGINT)
            return self.run.wait(timeout=120)

    def stop(self) -> None:
        self.release()
        if self.run is not None and self.run.poll() is None:
            self.run.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.run.wait(timeout=120)
        local_broker.stop(self.broker)


def _is_vllm_api(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return "rollwire.consumers.vllm_api_server" in process.cmdline()
    return False


def _describe(record: dict) -> str:
    if record["fault"] == "broker":
        return f"broker kill -9 at step {record['at_step']}, down {record['down_s']} s, started again on its data"
    return f"{record['fault']} kill -9 at step {record['at_step']}, running again after {record['back_after_s']} s"


def restarts(run_out: str, vllm_restarts: int) -> Counter:
    """Restarts per component: the supervisor's lines in the run's output, and the replica's of vLLM."""
    found = Counter(re.findall(r"^(\S+) exited with code -?\d+; restarting it", run_out, flags=re.MULTILINE))
    if vllm_restarts:
        found["vllm-0"] = vllm_restarts
    return found


def settle(chaos: Chaos) -> tuple[object, int]:
    """The run's ledger, and how often the replica restarted vLLM, from the topics."""
    from rollwire.core.bus import HeldDeadLetters, KafkaBusSettings, open_log, read_to_end
    from rollwire.run.ledger import run_ledger
    from rollwire.schemas.topics import Topics
    from rollwire.schemas.weights import ReplicaStatus
    topics = Topics(chaos.name)
    with open_log(KafkaBusSettings(bootstrap_servers=chaos.broker.bootstrap)) as log:
        ledger = run_ledger(log, topics)
        vllm = sum(1 for d in read_to_end(log, [topics.fleet], HeldDeadLetters())
                   if isinstance(d.event, ReplicaStatus) and d.event.state == "failed"
                   and (d.event.reason or "").startswith("vLLM exited"))
    return ledger, vllm


def leftovers(folder: Path) -> list[str]:
    """Processes still working on the run's files once it ended (none should be)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(folder / "run") in cmdline and proc.pid != os.getpid():
            found.append(cmdline[:200])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="trainer steps of the run (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="order and moments of the faults (default %(default)s)")
    parser.add_argument("--gap", type=int, default=2, help="steps the run makes between two faults (default %(default)s)")
    parser.add_argument("--outage", default="20-30", help="seconds the broker stays away, LOW-HIGH (default %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs, broker data)")
    args = parser.parse_args()
    low, _, high = args.outage.partition("-")
    needed = 1 + args.gap * len(FAULTS)
    if args.steps <= needed:
        parser.error(f"--steps {args.steps} leaves no room after the faults: use more than {needed}")

    folder = Path(tempfile.mkdtemp(prefix="chaos-"))
    print(f"chaos: {args.steps} steps, faults {', '.join(FAULTS)}; seed {args.seed}; files in {folder}", flush=True)
    started = time.monotonic()
    chaos = Chaos(folder, args.steps, args.seed, args.gap, (float(low), float(high or low)))
    try:
        chaos.start()
        chaos.play()
        code = chaos.finish()
        ledger, vllm_restarts = settle(chaos)
    finally:
        chaos.stop()
    run_out = (folder / "run.out").read_text(errors="replace")
    per_component = restarts(run_out, vllm_restarts)
    left = leftovers(folder)

    from rollwire.run.ledger import render_ledger
    print(f"rollwire run exited with code {code} after {(time.monotonic() - started) / 60:.1f} min; "
          f"{chaos.steps_done()} steps" + (f"; the trainer held {chaos.held_s:.0f} s near the end" if chaos.held_s else ""))
    print("restarts: " + ", ".join(f"{name} {per_component.get(name, 0)}" for name in COMPONENTS))
    print(render_ledger(ledger), end="")
    problems = ledger.problems()
    if code != 0:
        problems.append(f"rollwire run exited with code {code}; see {folder / 'run.out'}")
    if len(chaos.faults) != len(FAULTS):
        problems.append(f"only {len(chaos.faults)} of {len(FAULTS)} faults fired")
    if left:
        problems.append(f"processes outlived the run: {left}")
    figures = {"steps": chaos.steps_done(), "code": code, "faults": chaos.faults, "restarts": dict(per_component),
               "dispatched": ledger.dispatched, "trained": ledger.trained, "dropped": dict(ledger.dropped),
               "in_flight": dict(ledger.in_flight), "recorded_again": ledger.recorded_again,
               "trained_twice": len(ledger.trained_twice), "repeated_steps": ledger.repeated_steps,
               "versions": ledger.versions, "replicas": ledger.replicas, "problems": problems,
               "minutes": round((time.monotonic() - started) / 60, 1), "trainer_held_s": round(chaos.held_s, 1),
               "folder": str(folder)}
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    print(f"RESULT steps={figures['steps']} faults={len(chaos.faults)} dispatched={ledger.dispatched} "
          f"trained={ledger.trained} dropped={sum(ledger.dropped.values())} "
          f"in_flight={sum(ledger.in_flight.values())} problems={len(problems)}")
    for problem in problems:
        print(f"PROBLEM {problem}")
    if not args.keep and not problems:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
