"""Stopping one process by its PID, for the scripts here that start servers (the Kafka broker for
tests, the Docker engine for the stack): stdlib only, since they run before any install."""

from __future__ import annotations

import os
import signal
import time


def stop_pid(pid: int, timeout_s: float) -> None:
    """SIGTERM `pid`, wait up to `timeout_s` for it to end (reaped if it is our child, polled if
    not), then SIGKILL. A process that is already gone is fine."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)
            if waited == pid:
                return
        except ChildProcessError:  # not our child: poll for its exit instead
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
