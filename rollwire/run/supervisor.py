"""Starts a run's components as child processes, restarts the ones that crash, stops them in order.

    start(role)        python -m rollwire.run.roles ROLE <run_dir>/recipe.json, output to
                       <run_dir>/logs/ROLE-N.log, in its own session (Ctrl-C reaches only us),
                       told to die with us (Linux: PR_SET_PDEATHSIG)
    check()            a child that exited non-zero is restarted after a backoff; one that crashes
                       more than `max_restarts` times within `window_s` is crash-looping, and the
                       run fails with the tail of its log (a crash now and then never ends a run)
    stop()             SIGTERM in the order given (producers of work first), SIGKILL after a grace
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollwire.core.errors import RollwireError
from rollwire.core.processes import die_with_parent

STOP_ORDER = ("gateway", "feedback-api", "dispatcher", "env-worker", "joiner", "scorer", "trainer", "replica")
"""Whoever makes work stops first, so nothing downstream waits for what will not come."""


class RunFailed(RollwireError):
    """A component kept failing; the message names it and quotes its log."""


@dataclass
class Child:
    role: str
    index: int
    log_path: Path
    process: subprocess.Popen | None = None
    restarts: int = 0
    """Restarts so far, in the whole run."""
    crashes: list[float] = field(default_factory=list)
    """When it exited non-zero, the recent ones (monotonic seconds)."""
    restart_at: float | None = None
    """When a crashed child is due to be started again (backoff), or None."""
    finished: bool = False
    """Exited with status 0 on its own (e.g. the trainer after its last step)."""
    history: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Supervisor:
    def __init__(self, recipe_json: Path, log_dir: Path, *, max_restarts: int = 3, window_s: float = 300.0,
                 env: dict[str, str] | None = None, launchers: dict[str, list[str]] | None = None) -> None:
        self.recipe_json, self.log_dir, self.max_restarts, self.window_s = recipe_json, log_dir, max_restarts, window_s
        self.launchers = launchers or {}
        """What runs a role's module instead of `python -m`, by role (torchrun for a data-parallel trainer)."""
        self.env = {**os.environ, **(env or {})}
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, role: str, index: int = 0) -> Child:
        child = Child(role, index, self.log_dir / f"{role}-{index}.log")
        self._spawn(child)
        self.children.append(child)
        return child

    def _spawn(self, child: Child) -> None:
        with open(child.log_path, "ab") as out:
            launcher = self.launchers.get(child.role, [sys.executable, "-m"])
            child.process = subprocess.Popen(
                [*launcher, "rollwire.run.roles", child.role, str(self.recipe_json), "--index", str(child.index)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True, preexec_fn=die_with_parent)

    def check(self) -> list[str]:
        """Restarts crashed children after a backoff (without blocking); returns what happened, one
        line each (empty when all is well)."""
        events = []
        for child in self.children:
            if child.finished or child.process is None or child.process.poll() is None:
                continue
            if child.restart_at is not None:
                if time.monotonic() >= child.restart_at:
                    child.restart_at = None
                    self._spawn(child)
                continue
            code = child.process.returncode
            child.history.append(code)
            if code == 0:
                child.finished = True
                events.append(f"{child.name} finished")
                continue
            now = time.monotonic()
            child.crashes = [t for t in child.crashes if now - t < self.window_s] + [now]
            if len(child.crashes) > self.max_restarts:
                raise RunFailed(f"{child.name} exited with code {code} {len(child.crashes)} times within "
                                f"{self.window_s:.0f} s; last lines of {child.log_path}:\n{tail(child.log_path)}")
            child.restarts += 1
            child.restart_at = now + min(2.0 ** len(child.crashes), 10.0)
            events.append(f"{child.name} exited with code {code}; restarting it "
                          f"({len(child.crashes)} of {self.max_restarts} within {self.window_s:.0f} s), "
                          f"see {child.log_path}")
        return events

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM each role in STOP_ORDER and wait for it (up to `grace_s`), then SIGKILL what is left."""
        for role in STOP_ORDER:
            group = [c.process for c in self.children
                     if c.role == role and c.process is not None and c.process.poll() is None]
            for process in group:
                process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for process in group:
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self._stop_unrecorded(grace_s)

    def _stop_unrecorded(self, grace_s: float) -> None:
        """Stops children that no `Child` records: a Ctrl-C that lands inside `Popen`, after the fork
        and before `child.process` is set, leaves one (blocking the signal in this thread would not
        help: another thread takes it)."""
        known = {c.process.pid for c in self.children if c.process is not None}
        ours = ["rollwire.run.roles", str(self.recipe_json)]
        strays = [pid for pid in children_of(os.getpid(), running=ours) if pid not in known]
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for pid in strays:
            while time.monotonic() < deadline and _reap(pid) is None:
                time.sleep(0.1)
            if _reap(pid) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                _reap(pid, block=True)


def children_of(pid: int, running: list[str] | None = None) -> list[int]:
    """The live child processes of `pid` whose command line holds every word of `running` (Linux:
    from /proc; elsewhere none are found)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != pid or fields[0] == "Z":
                continue
            words = (stat.parent / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError):
            continue
        if all(word in words for word in running or []):
            found.append(int(stat.parent.name))
    return found


def _reap(pid: int, block: bool = False) -> int | None:
    """The exit status of our child `pid` once it ended (0 if already reaped elsewhere), else None."""
    try:
        done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if done == pid else None
