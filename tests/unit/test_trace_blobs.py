"""A trace too large for one event goes to the object store; the event points there, and readers get
the same graph back (or a clear error when the stored bytes are missing or altered)."""

from __future__ import annotations

import pytest
from builders import big_trace

from rollwire.core import trace_blobs
from rollwire.core.objectstore import LocalStore
from rollwire.schemas import Codec


def test_an_offloaded_trace_reads_back_the_same_graph(tmp_path):
    store, trace = LocalStore(tmp_path / "store"), big_trace()
    pointer = trace_blobs.offload(trace, store, prefix="run1")
    assert pointer.nodes == [] and pointer.blob.size_bytes > 4000
    assert store.exists("traces/run1/g-0.msgpack")
    assert trace_blobs.nodes_of(Codec().decode(Codec().encode(pointer, producer="t")).event, store) == trace.nodes


def test_altered_or_unreachable_trace_bytes_are_refused(tmp_path):
    store = LocalStore(tmp_path / "store")
    pointer = trace_blobs.offload(big_trace(), store, prefix="run1")
    with pytest.raises(trace_blobs.TraceBlobError, match="open the run's object store"):
        trace_blobs.nodes_of(pointer, None)
    store.put_bytes("traces/run1/g-0.msgpack", b"\x90")
    with pytest.raises(trace_blobs.TraceBlobError, match="sha256"):
        trace_blobs.nodes_of(pointer, store)
