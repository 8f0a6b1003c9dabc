"""Helpers for the child processes rollwire starts."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
from collections.abc import Mapping

CREDENTIAL_NAMES = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|_KEY$|_KEY_|^AWS_|SASL|SSL_KEY", re.IGNORECASE)
"""Environment variables that may hold a credential: store keys, bus passwords, bearer tokens."""


def agent_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment an agent or harness process gets: this process's, less every variable that
    may hold a credential (`CREDENTIAL_NAMES`). Agents run code the model wrote; they reach the
    model through their rollout's URL and need nothing of the bus or the store."""
    return {name: value for name, value in environ.items() if not CREDENTIAL_NAMES.search(name)}


QUIET_LOGGERS = ("httpx", "httpcore", "urllib3")
"""Libraries that log every request at INFO: at hundreds of requests a second that is noise, and CPU."""


def yield_idle_cpu() -> None:
    """Makes torch's OpenMP threads sleep when they wait instead of spinning (`OMP_WAIT_POLICY=PASSIVE`)
    in this process and those it starts, unless the environment says otherwise. Must run before torch
    is imported. A run's processes share the CPUs (trainer, vLLM, warm start): spinning threads burn
    the time slices the others need. Measured here (2 cores, a tiny model's training steps, two
    processes at once): 29.6 s each spinning, 12.4 s each sleeping, 7.2 s for one alone."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGTERM when the process that started it dies, even by SIGKILL
    (Linux `PR_SET_PDEATHSIG`), so a killed supervisor leaves no servers behind. Elsewhere: no-op.
    Linux sends it when the *thread* that started the child ends: a child that must outlive a
    short-lived thread is started from one that lives as long as the process needs it."""
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


def configure_logging(level: int, fmt: str) -> None:
    """The process's log format and level, with per-request library logs kept to warnings."""
    logging.basicConfig(level=level, format=fmt)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
