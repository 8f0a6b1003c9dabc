"""Errors of the event log. Both backends raise these, never their library's own types."""

from rollwire.core.errors import RollwireError


class BusError(RollwireError):
    """The event log refused or failed an operation."""


class TopicError(BusError):
    """A topic is missing, or could not be created or described."""


class DeliveryError(BusError):
    """Records were not durably written; `failures` lists (topic, key, reason) for each."""

    def __init__(self, message: str, failures: list[tuple[str, bytes | None, str]] | None = None):
        super().__init__(message)
        self.failures = failures or []


class CommitFailedError(BusError):
    """Offsets were not committed because this consumer no longer owns the partition (a rebalance
    moved it). Its uncommitted records will be delivered again to the new owner."""
