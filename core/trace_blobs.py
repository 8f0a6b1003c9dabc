"""Traces too large for one event travel through the object store; the event keeps a `BlobPointer`.

    env worker:  send(TraceRecorded) ──EventTooLargeError──▶ offload(trace, store) ──▶ send the pointer
    readers:     nodes_of(trace, store)  → the graph, from the event or from the store (sha256 checked)

A long agentic rollout (many tool calls, long contexts) can record megabytes of token ids; the
rollout itself stays small enough for the bus, and only its trace moves to the store, under
`traces/<topic prefix>/<rollout id>.msgpack`.
"""

from __future__ import annotations

import hashlib

import msgpack
from pydantic import TypeAdapter

from rollwire.core.objectstore import ObjectStore, ObjectStoreError
from rollwire.schemas.base import BlobPointer
from rollwire.schemas.rollout import TraceNode, TraceRecorded

MEDIA_TYPE = "application/vnd.rollwire.trace-nodes+msgpack"
_NODES = TypeAdapter(list[TraceNode])


class TraceBlobError(ObjectStoreError):
    """A trace's stored graph is missing, or its bytes are not the ones the event names."""


def blob_key(prefix: str, rollout_id: str) -> str:
    return f"traces/{prefix}/{rollout_id}.msgpack"


def offload(trace: TraceRecorded, store: ObjectStore, *, prefix: str) -> TraceRecorded:
    """Stores the trace's graph and returns the event that points to it (and holds no nodes)."""
    data = msgpack.packb(_NODES.dump_python(trace.nodes, mode="json"))
    key = blob_key(prefix, trace.rollout_id)
    store.put_bytes(key, data)
    pointer = BlobPointer(uri=store.uri(key), sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data),
                          media_type=MEDIA_TYPE)
    return trace.model_copy(update={"nodes": [], "blob": pointer})


def nodes_of(trace: TraceRecorded, store: ObjectStore | None) -> list[TraceNode]:
    """The trace's graph, read from the store when the event points there."""
    if trace.blob is None:
        return list(trace.nodes)
    if store is None:
        raise TraceBlobError(f"the trace of {trace.rollout_id} is stored at {trace.blob.uri}: "
                             "open the run's object store to read it")
    data = store.get_bytes(store.key(trace.blob.uri))
    digest = hashlib.sha256(data).hexdigest()
    if digest != trace.blob.sha256 or len(data) != trace.blob.size_bytes:
        raise TraceBlobError(f"{trace.blob.uri} holds {len(data)} bytes with sha256 {digest}, but the trace "
                             f"event names {trace.blob.size_bytes} bytes with sha256 {trace.blob.sha256}")
    return _NODES.validate_python(msgpack.unpackb(data))
