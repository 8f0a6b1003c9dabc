"""The root of every exception rollwire raises on purpose.

    RollwireError
    ├── ConfigError            a setting that cannot work; the message names the setting
    │   └── UnknownNameError   rollwire.core.registry — a variant name no registry knows (valid ones listed)
    │       └── UnknownAlgorithmError   rollwire.streams.advantages
    ├── SchemaError            rollwire.schemas.errors — bytes or fields that are not a valid event
    │   ├── CorruptEventError
    │   ├── UnknownEventTypeError
    │   ├── SchemaVersionTooNewError
    │   ├── InvalidEventError
    │   └── EventTooLargeError
    ├── BusError               rollwire.core.bus.errors — the event log refused or failed an operation
    │   ├── TopicError
    │   ├── DeliveryError
    │   └── CommitFailedError
    ├── ObjectStoreError       rollwire.core.objectstore — an object could not be read or written
    │   ├── ObjectNotFoundError
    │   └── TraceBlobError     rollwire.core.trace_blobs — a trace's stored graph is missing or altered
    ├── CheckpointError        rollwire.core.weight_versions — a published weight version cannot be used
    │   ├── CheckpointMissingError
    │   ├── CorruptCheckpointError
    │   └── IncompatibleCheckpointError
    ├── DeltaError             rollwire.core.weight_deltas — a weight delta does not apply to the file given
    ├── TransferError          rollwire.core.weight_transfer — a version could not be received from the trainer directly
    ├── HttpError              rollwire.core.http — a JSON service failed or refused a request
    ├── VllmError              rollwire.consumers.vllm_control — the vLLM server refused a request
    │   └── NoReplica          rollwire.producers.routing — no replica serves a version the rollout may use
    ├── VllmServerError        rollwire.consumers.vllm_server — the server could not start, or died
    ├── HarnessError           rollwire.producers.harnesses — a harness could not finish a rollout
    │   ├── HarnessTimeout
    │   └── ResourceLimit      (the harness's container hit its memory or process limit)
    ├── EndpointError          rollwire.core.endpoints — an OpenAI-compatible endpoint failed
    ├── UserError              rollwire.producers.users — a simulated user could not answer
    ├── JudgeError             rollwire.producers.judges — an LLM judge gave no score (every try's reason)
    ├── TeacherError           rollwire.streams.teacher — the distillation teacher failed
    └── RunFailed              rollwire.run.supervisor — a component of a run kept failing

Each area adds its own subclasses; messages say what to change, not only what went wrong.
"""


class RollwireError(Exception):
    """Base class for errors raised by rollwire itself."""


class ConfigError(RollwireError, ValueError):
    """A setting or argument that cannot work; the message names it and what to change."""
