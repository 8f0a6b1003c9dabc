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

A partition with no committed offset had the same window, and no seek to close it: aiokafka
resets it to the earliest offset and fetches at once, faust's seek to "committed" skips it (there
is none), and the records fetched before the flow resumed were thrown away with nothing to fetch
them again. A restarted joiner lost the served records that arrived on such a partition while it
was down (tests/integration/test_feedback_joiner.py). Such partitions are now sought to their
beginning after faust's seek, which is what `auto_offset_reset = "earliest"` promises them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
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


@contextmanager
def _uncommitted_from_the_beginning(consumer: Any, is_changelog: Callable[[Any], bool]) -> Iterator[None]:
    """While inside, `consumer.perform_seek` also seeks the stream partitions that have no committed
    offset (faust's `_committed_offset` holds None for them) to their beginning."""
    seek = consumer.perform_seek

    async def perform_seek() -> None:
        await seek()
        fresh = [tp for tp in consumer.assignment() if not is_changelog(tp) and "__assignor-__leader" not in tp.topic
                 and consumer._committed_offset.get(tp) is None]
        if fresh:
            for tp, offset in (await consumer.earliest_offsets(*fresh)).items():
                await consumer.seek(tp, offset)

    consumer.perform_seek = perform_seek
    try:
        yield
    finally:
        del consumer.perform_seek  # the class's method again


class SeekBeforeFetchRecovery(Recovery):
    """`Recovery` whose two ways of handing partitions back to the streams (after a restore, and
    when nothing needed restoring) resume the stream partitions last, and read the ones never
    committed from their beginning."""

    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        consumer = self.app.consumer
        with _partitions_resumed_on_exit(consumer), _uncommitted_from_the_beginning(consumer, self._is_changelog_tp):
            await super().on_recovery_completed(generation_id)

    async def _resume_streams(self, generation_id: int = 0) -> None:
        consumer = self.app.consumer
        with _partitions_resumed_on_exit(consumer), _uncommitted_from_the_beginning(consumer, self._is_changelog_tp):
            await super()._resume_streams(generation_id)


class SeekBeforeFetchTableManager(TableManager):
    """The table manager faust builds from `App(TableManager=...)`, with the recovery above."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = SeekBeforeFetchRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
