"""A started faust worker whose stream stops while its process lives on exits for its supervisor
(`Liveness`, judged from the broker's offsets), and a healthy one does not. A restarted scorer was
seen in a chaos run to read its ticks and never its rollouts for 15 minutes, every rollout of the
run waiting on it; here the stop is made by pausing the worker's partitions once it has started
(ticks go on arriving, from the worker's own timer)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from rollwire.streams.faust_app import STALLED

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

WORKER = textwrap.dedent("""
    import sys
    from rollwire.core.bus import KafkaBusSettings, catalog_topics, open_log
    from rollwire.schemas.topics import Topics
    from rollwire.streams.faust_app import FaustWorkerSettings, Liveness, build_app, run_worker, scorer_inputs
    from rollwire.streams.scoring import ScorerSettings
    folder, bootstrap, prefix, stop_reading = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "stop"
    bus, topics = KafkaBusSettings(bootstrap_servers=bootstrap), Topics(prefix)
    open_log(bus).create_topics(catalog_topics(topics))
    settings = FaustWorkerSettings(app_id=f"{prefix}-scorer", data_dir=folder, tick_s=0.5, session_timeout_s=6)
    app = build_app(settings, ScorerSettings(), bus=bus, topics=topics)

    @app.timer(interval=3.0)
    async def stop_the_stream() -> None:
        if stop_reading:
            app.consumer.pause_partitions(app.consumer.assignment())

    run_worker(app, startup_timeout_s=120, liveness=Liveness(bus, settings.app_id, scorer_inputs(topics), 8))
""")


def start_worker(folder, bootstrap: str, stop: bool) -> subprocess.Popen:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return subprocess.Popen([sys.executable, "-c", WORKER, str(folder), bootstrap, prefix, "stop" if stop else "go"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_worker_whose_stream_stops_exits_for_its_supervisor_and_a_healthy_one_runs_on(kafka_bootstrap, tmp_path):
    stopped = start_worker(tmp_path / "stopped", kafka_bootstrap, stop=True)
    healthy = start_worker(tmp_path / "healthy", kafka_bootstrap, stop=False)
    started = time.monotonic()
    try:
        output = stopped.communicate(timeout=150)[0]
        assert stopped.returncode == STALLED, output[-3000:]
        assert "uncommitted for" in output and "supervisor starts it again" in output, output[-3000:]
        # the healthy worker, started with it, has lived past the same timeout several times over
        while time.monotonic() - started < 30:
            time.sleep(1)
        assert healthy.poll() is None, healthy.communicate()[0][-3000:]
    finally:
        for process in (stopped, healthy):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
