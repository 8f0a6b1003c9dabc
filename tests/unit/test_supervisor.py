"""The supervisor stops what it started, in order, including a child it never got to record."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rollwire.run.supervisor import Supervisor, children_of


def test_stop_ends_a_child_that_no_record_names(tmp_path):
    (tmp_path / "recipe.json").write_text("{}")
    supervisor = Supervisor(tmp_path / "recipe.json", tmp_path / "logs")
    # what a Ctrl-C inside Popen leaves: a child forked, never recorded
    role = ["rollwire.run.roles", str(tmp_path / "recipe.json")]
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *role], start_new_session=True)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    assert stray.pid in children_of(os.getpid(), running=role) and bystander.pid not in children_of(os.getpid(), role)
    started = time.monotonic()
    supervisor.stop(grace_s=10)
    assert stray.poll() is not None or stray.wait(timeout=1) is not None
    assert time.monotonic() - started < 10 and stray.pid not in children_of(os.getpid())
    assert bystander.poll() is None  # not the supervisor's: left alone
    bystander.kill()
    bystander.wait()


def _crasher(tmp_path, **limits) -> Supervisor:
    """A supervisor whose every child exits 3 at once."""
    (tmp_path / "recipe.json").write_text("{}")
    return Supervisor(tmp_path / "recipe.json", tmp_path / "logs", launchers={"scorer": [
        sys.executable, "-c", "import sys; sys.exit(3)"]}, **limits)


def _check_until(supervisor: Supervisor, restarts: int, timeout_s: float = 20) -> list[str]:
    events, deadline = [], time.monotonic() + timeout_s
    while supervisor.children[0].restarts < restarts or supervisor.children[0].process.poll() is None:
        assert time.monotonic() < deadline, events
        events += supervisor.check()
        time.sleep(0.05)
    return events


def test_a_crash_now_and_then_is_restarted_for_as_long_as_the_run_lasts(tmp_path):
    from rollwire.run.supervisor import RunFailed
    supervisor = _crasher(tmp_path, max_restarts=1, window_s=0.5)  # crashes 2 s apart (backoff): never 2 in 0.5 s
    supervisor.start("scorer")
    events = _check_until(supervisor, restarts=3)
    assert supervisor.children[0].history == [3, 3, 3]
    assert events[0].startswith("scorer-0 exited with code 3; restarting it (1 of 1 within 0 s)")
    looping = _crasher(tmp_path, max_restarts=1, window_s=60)
    looping.start("scorer")
    try:
        _check_until(looping, restarts=2)
    except RunFailed as exc:  # the second crash within a minute: crash-looping
        assert "scorer-0 exited with code 3 2 times within 60 s" in str(exc)
    else:
        raise AssertionError("a crash loop was restarted without end")


def test_a_vllm_server_a_killed_replica_left_behind_is_ended_by_the_next_start(tmp_path):
    """What `kill -9` of a replica can leave: its server (here a stand-in whose command line says
    vllm) still running in its own process group. The next server's start ends it, and leaves a
    process that is not vLLM's alone even if the noted id names its group."""
    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    sleeper = "import time; time.sleep(60)"
    left = subprocess.Popen([sys.executable, "-c", sleeper, "vllm.entrypoints.openai.api_server"],
                            start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", sleeper, "not-an-inference-server"], start_new_session=True)
    try:
        pid_file = tmp_path / "vllm.pid"
        server = VllmServer(VllmServerSettings(model="m", pid_file=pid_file))
        pid_file.write_text(str(other.pid))
        server._end_left_behind()
        assert other.poll() is None
        pid_file.write_text(str(left.pid))
        server._end_left_behind()
        assert left.wait(timeout=5) == -9
    finally:
        for proc in (left, other):
            proc.kill()
            proc.wait()
