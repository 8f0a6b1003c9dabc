"""A faust worker that cannot finish starting exits with the reason, for its supervisor to start
it again, instead of sitting in recovery for good (`run_worker`'s `startup_timeout_s`). Here the
"broker" it is given takes connections and never answers, so its start never ends."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

from rollwire.streams.faust_app import STARTUP_FAILED

WORKER = textwrap.dedent("""
    import sys
    from rollwire.core.bus import KafkaBusSettings
    from rollwire.schemas.topics import Topics
    from rollwire.streams.faust_app import FaustWorkerSettings, build_app, run_worker
    from rollwire.streams.scoring import ScorerSettings
    settings = FaustWorkerSettings(app_id="never-starts", data_dir=sys.argv[1])
    app = build_app(settings, ScorerSettings(), bus=KafkaBusSettings(bootstrap_servers=sys.argv[3]),
                    topics=Topics("nowhere"))
    run_worker(app, startup_timeout_s=float(sys.argv[2]))
""")


def test_a_worker_that_does_not_finish_starting_exits_with_the_reason(tmp_path):
    silent = socket.create_server(("127.0.0.1", 0), backlog=16)  # connections queue; no byte comes back
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), "4", f"127.0.0.1:{silent.getsockname()[1]}"],
                              capture_output=True, text=True, timeout=120)
    finally:
        silent.close()
    assert done.returncode == STARTUP_FAILED, done.stderr[-2000:]
    assert "did not finish starting within 4 s" in done.stderr and "supervisor starts it again" in done.stderr
    assert time.monotonic() - started < 60
