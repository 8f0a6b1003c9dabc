"""Helpers for the child processes rollwire starts."""

from __future__ import annotations

import ctypes
import signal


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGTERM when the process that started it dies, even by SIGKILL
    (Linux `PR_SET_PDEATHSIG`), so a killed supervisor leaves no servers behind. Elsewhere: no-op."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM (a supervisor's or `docker stop`'s request to stop) ends the process the way Ctrl-C
    does: as a `KeyboardInterrupt`, so `finally` blocks drain, commit and close."""
    signal.signal(signal.SIGTERM, _interrupt)
