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
