"""The object store away for a while (a real S3 endpoint behind a gate that refuses connections):
a trainer's publish waits and completes when it is back; until then no version is complete, so
none can be announced; past `outage_s` the error says how long it waited."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
from builders import write_safetensors

from rollwire.core.objectstore import ObjectStoreError, S3Store
from rollwire.core.weight_versions import publish, stored_versions, version_prefix


class Gate:
    """A loopback TCP proxy to `upstream` that can be shut (new connections refused, open ones cut)
    and opened again on the same port."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._listener: socket.socket | None = None
        self._open: list[socket.socket] = []

    def open(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def shut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone leaves it listening)
            listener.close()
        for conn in self._open:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()
        self._open = []

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def _store(endpoint: str, bucket: str, **kw) -> S3Store:
    return S3Store(endpoint, bucket, access_key="test", secret_key="test", secure=False, region="us-east-1", **kw)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"embed.weight": ("F32", [64, 64])})
    (folder / "config.json").write_text('{"hidden_size": 64}')
    return folder


def test_a_publish_waits_out_a_store_outage_and_nothing_is_complete_before_it_ends(s3_endpoint, checkpoint):
    gate = Gate(s3_endpoint)
    gate.open()
    bucket = f"b{uuid.uuid4().hex[:12]}"
    through_gate, direct = _store(f"127.0.0.1:{gate.port}", bucket, outage_s=120), _store(s3_endpoint, bucket)
    gate.shut()
    done: dict = {}
    publishing = threading.Thread(target=lambda: done.update(published=publish(
        through_gate, checkpoint, version_prefix("policy", 1), policy="policy", version=1, step=1)))
    publishing.start()
    time.sleep(4)
    assert publishing.is_alive() and stored_versions(direct, "policy") == []  # waiting; no version complete
    gate.open()
    publishing.join(60)
    assert not publishing.is_alive() and done["published"].manifest.version == 1
    assert stored_versions(direct, "policy") == [1]
    gate.shut()
    impatient = _store(f"127.0.0.1:{gate.port}", bucket, outage_s=1, create_bucket=False)
    with pytest.raises(ObjectStoreError, match=r"the S3 server was unreachable for 1 s"):
        impatient.put_bytes("policy/late", b"x")
