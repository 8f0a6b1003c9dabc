"""Faust's table recovery with one ordering changed: stream partitions resume only after faust has
sought them to their committed offsets and resumed the flow.

faust-streaming 0.15 ends recovery by resuming the stream partitions, then seeking them to the
committed offsets (one broker round trip per partition), then resuming the flow, which clears
the stream queues. Records fetched in that window are delivered, advance the consumer's read
offset past records that the clear then throws away, and the refetch after the seek drops those
as already read. A restarted scorer lost rollouts this way: under CPU load, one restart in three
left groups open forever (tests/integration/test_scorer_recovery.py, `DEVLOG=1` shows the
`DROPPED MESSAGE ROFF` lines). Holding the stream partitions paused until faust's sequence has
finished closes the window: they are then fetched once, from the committed offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from faust.tables import TableManager
from faust.tables.recovery import Recovery


@contextmanager
def _partitions_resumed_on_exit(consumer: Any) -> Iterator[None]:
    """While inside, `consumer.resume_partitions` only records its partitions; they are resumed
    on a normal exit. On an error they stay paused: faust restarts recovery, which resumes them."""
    held: set = set()

    def hold(tps: Iterable) -> None:
        held.update(tps)

    consumer.resume_partitions = hold
    try:
        yield
    finally:
        del consumer.resume_partitions  # the class's method again
    if held:
        consumer.resume_partitions(held)


class SeekBeforeFetchRecovery(Recovery):
    """`Recovery` whose two ways of handing partitions back to the streams (after a restore, and
    when nothing needed restoring) resume the stream partitions last."""

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        with _partitions_resumed_on_exit(self.app.consumer):
            await super().on_recovery_completed(generation_id)

    async def _resume_streams(self, generation_id: int = 0) -> None:
        with _partitions_resumed_on_exit(self.app.consumer):
            await super()._resume_streams(generation_id)


class SeekBeforeFetchTableManager(TableManager):
    """The table manager faust builds from `App(TableManager=...)`, with the recovery above."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = SeekBeforeFetchRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
