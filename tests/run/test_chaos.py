"""Many faults in one run (`bench/chaos.py`, as a user runs it): every component `kill -9`ed at a
random moment and the Kafka broker away for 20-30 s, and the run still finishes with its promises
kept, judged from its events alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.vllm, pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(2400)]
STEPS, GAP = 22, 1
"""Room for the eight faults, each a step after the one before has recovered (the run goes on
stepping meanwhile; with `bench/chaos.py`'s default two steps apart, 24 steps ended before the
last two faults), and steps after the last for the restarted components to keep up."""


def test_a_run_survives_every_component_killed_and_the_broker_restarted(tmp_path, capsys):
    figures_path = tmp_path / "chaos.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "chaos.py"), "--steps", str(STEPS), "--gap", str(GAP),
                           "--seed", "7", "--json", str(figures_path)], capture_output=True, text=True, timeout=2200)
    with capsys.disabled():  # the counts in CI's output, whatever the verdict
        print("\n" + done.stdout[-4000:])
    assert figures_path.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(figures_path.read_text())
    assert figures["problems"] == [], done.stdout[-3000:]
    assert done.returncode == 0 and figures["code"] == 0 and figures["steps"] == STEPS
    faults = {f["fault"] for f in figures["faults"]}
    assert faults == {"dispatcher-0", "env-worker-0", "env-worker-1", "scorer-0", "trainer-0", "replica-0",
                      "vllm-0", "broker"}
    outage = next(f for f in figures["faults"] if f["fault"] == "broker")
    assert 20 <= outage["down_s"] <= 30
    # each killed component was started again by whoever supervises it
    assert all(figures["restarts"].get(name, 0) >= 1 for name in faults - {"broker"}), figures["restarts"]
    # every dispatched rollout accounted for: trained (once), dropped with a reason, or in flight
    in_flight = sum(figures["in_flight"].values())
    assert figures["trained"] + sum(figures["dropped"].values()) + in_flight == figures["dispatched"]
    assert figures["trained"] == STEPS * 32 and figures["trained_twice"] == 0 and figures["repeated_steps"] == []
    versions = figures["versions"]["policy"]
    assert versions == sorted(set(versions)) and versions[-1] == STEPS
    assert set(figures["replicas"].values()) == {STEPS}
