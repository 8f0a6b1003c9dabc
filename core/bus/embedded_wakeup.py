"""Waking an embedded-log consumer the moment a topic it reads is written, instead of on a timer.

Producers in any process append to `<root>/topics/<topic>.sqlite` in SQLite transactions. After
each commit the appender rings the topic's doorbell: it rewrites one byte of
`<root>/topics/<topic>.bell`. On Linux a `TopicWatch` asks inotify about the topics folder and
wakes when the bell of one of its topics rings, so an idle consumer costs no CPU and sees a record
within a scheduler tick of its commit. (Watching the SQLite files themselves is not enough: the
last write of a commit lands in the WAL file before the commit becomes visible in its shared
memory index, which inotify does not see.) Where inotify is missing (another OS, or the per-user
inotify limit reached) the watch falls back to sleeping 1 ms, doubling to 20 ms.

    watch.wait(timeout_s)     returns early when a watched topic may have changed (spurious
                              wake-ups are possible, missed ones are not: a commit after the
                              caller's last read leaves an event pending)
    Doorbell(folder, topic).ring()   after each committed append
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
import time
import weakref
from collections.abc import Iterable
from pathlib import Path

logger = logging.getLogger(__name__)

_IN_MODIFY, _IN_Q_OVERFLOW = 0x002, 0x4000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, name length; the name follows
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.001, 0.02


def bell_path(topics_folder: Path, topic: str) -> Path:
    return topics_folder / f"{topic}.bell"


class Doorbell:
    """Rings one topic's bell: a one-byte rewrite of its bell file, which inotify reports."""

    def __init__(self, topics_folder: Path, topic: str) -> None:
        self._fd = os.open(bell_path(topics_folder, topic), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._finalizer = weakref.finalize(self, os.close, self._fd)

    def ring(self) -> None:
        os.pwrite(self._fd, b"\1", 0)

    def close(self) -> None:
        self._finalizer()


def _inotify(folder: Path) -> int | None:
    """An inotify descriptor watching `folder`, or None where inotify cannot be had."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        logger.debug("inotify unavailable (%s): polling the embedded log", errno.errorcode.get(ctypes.get_errno()))
        return None
    if libc.inotify_add_watch(fd, os.fsencode(folder), _IN_MODIFY) < 0:
        os.close(fd)
        return None
    return fd


class TopicWatch:
    """Waits for writes to some topics of one embedded log."""

    def __init__(self, topics_folder: Path, topics: Iterable[str]) -> None:
        self._bells = {bell_path(Path(), t).name.encode() for t in topics}
        self._fd = _inotify(topics_folder)
        self._pause = _BACKOFF_MIN_S
        if self._fd is not None:
            self._finalizer = weakref.finalize(self, os.close, self._fd)

    @property
    def event_driven(self) -> bool:
        """Whether writes wake the waiter (inotify), rather than a timer."""
        return self._fd is not None

    def wait(self, timeout_s: float) -> None:
        """Returns when a watched topic may have been written since the last call, or after `timeout_s`."""
        if timeout_s <= 0:
            return
        if self._fd is None:
            time.sleep(min(self._pause, timeout_s))
            self._pause = min(self._pause * 2, _BACKOFF_MAX_S)
            return
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self._fd], [], [], remaining)
            if readable and self._drain():
                return

    def woke(self) -> None:
        """Tells the fallback timer that records came: the next wait starts short again."""
        self._pause = _BACKOFF_MIN_S

    def _drain(self) -> bool:
        """Reads every pending event; whether one concerns a watched topic."""
        assert self._fd is not None
        relevant = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return relevant
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, length = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                relevant = relevant or name in self._bells or bool(mask & _IN_Q_OVERFLOW)
                offset += _EVENT.size + length

    def close(self) -> None:
        if self._fd is not None:
            self._finalizer()
            self._fd = None
