"""Weight versions straight from the trainer's memory to the replicas' engine workers over
`torch.distributed` (gloo), with no object-store read: the direct path beside the store.

    trainer (WeightSender)                           a replica's vLLM worker (receive)
    TCPStore at host:port; `offer(version)` holds
    its published files in memory; the event says
    `WeightsPublished.direct = "gloo://host:port"`
                                                     ticket = add("tickets", 1)
                                                     set("request/<ticket>", {version, manifest, who})
    answers set("answer/<ticket>", {files: sizes})
    or {refused: why} (a version no longer held)
    ProcessGroupGloo(rank 0 of 2) ------------------ ProcessGroupGloo(rank 1 of 2), under "t<ticket>/"
    sends the manifest, then every .safetensors      receives each into one host buffer, checks
    file's bytes                                     sha256(manifest) == the event's digest and every
                                                     file's sha256 == the manifest's; the tensors are
                                                     views of the buffers (their safetensors offsets)
    the group ends with the transfer                 the group ends with the transfer

Each transfer has its own two-rank group, made for it and dropped after it, so nothing is left
to tear down when a replica leaves, and a replica that dies mid-transfer costs the sender one
timed-out send. The object store stays the record: what a replica receives is checked against
the digests the trainer wrote there (the event names the manifest's digest, the manifest every
file's), and a replica that cannot get a version this way (no sender, the version superseded, a
digest that differs, a timeout) fetches it from the store as before. On CUDA the same exchange
runs over NCCL (`bench/gpu_check.sh`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rollwire.core.errors import RollwireError
from rollwire.schemas.manifest import Manifest

logger = logging.getLogger(__name__)

SCHEME = "gloo"
_POLL_S = 0.005
ANSWER_TIMEOUT_S = 10.0
"""A live sender answers a request within milliseconds; a store whose sender has stopped, never."""
RENDEZVOUS_KEYS = ("0/0", "0/1")
"""What a two-rank gloo group writes into its store to connect (each rank's address, under the
group's first device): a `TCPStore` keeps a key until it is deleted, so each transfer deletes its
own, as the receiver deletes its request and answer; without this the trainer's store grew by four
keys a version, ~1 KB of native memory per version that no Python allocation trace shows.
`test_weight_transfer` counts the store's keys, so a torch that names them otherwise fails there."""


class TransferError(RollwireError):
    """A version could not be received directly; the replica fetches it from the object store."""


@dataclass(frozen=True)
class Offered:
    """A version held for direct transfer: its manifest's bytes and its safetensors files' bytes."""

    version: int
    manifest_sha256: str
    manifest_data: bytes
    files: list[tuple[str, Any]]
    """(name, uint8 tensor of the file's bytes), in the manifest's order."""


class WeightSender:
    """Serves the newest offered version to whichever replica workers ask, each over its own
    two-rank gloo group; runs a thread until `close()`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 60.0,
                 max_parallel: int = 4) -> None:
        import torch.distributed as dist
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._store: Any = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=self._timeout)
        self.address = f"{SCHEME}://{host}:{self._store.port}"
        """Where replicas reach this sender (`WeightsPublished.direct`)."""
        self._offered: Offered | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._pool = ThreadPoolExecutor(max_parallel, thread_name_prefix="rollwire-send")
        self.sent = 0
        """Transfers completed."""
        self._thread = threading.Thread(target=self._serve, name="rollwire-weight-sender", daemon=True)
        self._thread.start()

    def offer(self, version: int, folder: Path, manifest_data: bytes) -> None:
        """Holds version `version` (its whole files in `folder`, as published) for transfer, in place
        of the one held before; `manifest_data` is the manifest as stored (its digest is the event's)."""
        import numpy as np
        import torch
        manifest = Manifest.model_validate_json(manifest_data)
        entries = manifest.result or manifest.files
        files = [(e.name, torch.from_numpy(np.fromfile(folder / e.name, dtype=np.uint8)))
                 for e in entries if e.name.endswith(".safetensors")]
        for (name, data), entry in zip(files, [e for e in entries if e.name.endswith(".safetensors")]):
            if data.numel() != entry.size_bytes:
                raise TransferError(f"{folder / name} has {data.numel()} bytes, its manifest says {entry.size_bytes}")
        with self._lock:
            self._offered = Offered(version, hashlib.sha256(manifest_data).hexdigest(), manifest_data, files)

    def _serve(self) -> None:
        served = 0
        while not self._closed.is_set():
            try:
                tickets = self._store.add("tickets", 0)
            except Exception:  # noqa: BLE001 - the store is being closed
                if self._closed.is_set():
                    return
                raise
            if tickets <= served:
                time.sleep(_POLL_S)
                continue
            for ticket in range(served + 1, tickets + 1):
                self._pool.submit(self._answer, ticket)
            served = tickets

    def _answer(self, ticket: int) -> None:
        import torch
        import torch.distributed as dist
        try:
            self._store.wait([f"request/{ticket}"], self._timeout)
            request = json.loads(self._store.get(f"request/{ticket}"))
            with self._lock:
                offered = self._offered
            if offered is None or (offered.version, offered.manifest_sha256) != \
                    (request["version"], request["manifest_sha256"]):
                held = f"version {offered.version}" if offered else "nothing"
                self._store.set(f"answer/{ticket}", json.dumps(
                    {"refused": f"the trainer holds {held}, not version {request['version']} with that manifest"}))
                return
            self._store.set(f"answer/{ticket}", json.dumps(
                {"manifest_bytes": len(offered.manifest_data),
                 "files": [[name, int(data.numel())] for name, data in offered.files]}))
            rendezvous = dist.PrefixStore(f"t{ticket}/", self._store)
            group = dist.ProcessGroupGloo(rendezvous, 0, 2, self._timeout)
            try:
                group.send([torch.frombuffer(bytearray(offered.manifest_data), dtype=torch.uint8)], 1, 0).wait()  # type: ignore[attr-defined]
                for tag, (_, data) in enumerate(offered.files, start=1):
                    group.send([data], 1, tag).wait()  # type: ignore[attr-defined]
            finally:
                for key in RENDEZVOUS_KEYS:  # both ranks are connected (or gone): the addresses are spent
                    rendezvous.delete_key(key)
            self.sent += 1
            logger.info("sent version %d to %s (%.1f MB)", offered.version, request.get("who", "?"),
                        sum(d.numel() for _, d in offered.files) / 1e6)
        except Exception as exc:  # noqa: BLE001 - one failed transfer; the replica falls back to the store
            logger.warning("direct transfer %d failed: %s", ticket, exc)

    def close(self) -> None:
        """Stops answering and closes the rendezvous store, so that a replica asking later fails at
        once; transfers under way end on their own (or time out at the receiver)."""
        self._closed.set()
        self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._offered = None
        self._store = None  # the last reference: the store's server closes


@dataclass(frozen=True)
class Received:
    """A version received and verified: its manifest, and every tensor as (name, tensor)."""

    manifest: Manifest
    tensors: list[tuple[str, Any]]


def receive(address: str, version: int, manifest_sha256: str, *, who: str = "",
            timeout_s: float = 60.0, connect_timeout_s: float = 2.0) -> Received:
    """Version `version` from the sender at `address` (`gloo://host:port`), verified against
    `manifest_sha256` (the event's) and the manifest's file digests; the tensors are views of the
    received files. Raises `TransferError` with the reason."""
    import torch
    import torch.distributed as dist
    parts = urlsplit(address)
    if parts.scheme != SCHEME or not parts.hostname or not parts.port:
        raise TransferError(f"{address!r} is not a direct weight address (gloo://host:port)")
    try:
        store = dist.TCPStore(parts.hostname, parts.port, is_master=False,
                              timeout=datetime.timedelta(seconds=connect_timeout_s))
    except Exception as exc:  # noqa: BLE001 - torch raises several kinds; all mean "not reachable"
        raise TransferError(f"no weight sender at {address}: {str(exc).splitlines()[0]}") from exc
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    try:
        ticket = store.add("tickets", 1)
        store.set(f"request/{ticket}", json.dumps({"version": version, "manifest_sha256": manifest_sha256,
                                                    "who": who}))
        store.wait([f"answer/{ticket}"], datetime.timedelta(seconds=min(timeout_s, ANSWER_TIMEOUT_S)))
        answer = json.loads(store.get(f"answer/{ticket}"))
        store.delete_key(f"request/{ticket}")  # the sender's store keeps every key until deleted
        store.delete_key(f"answer/{ticket}")
        if "refused" in answer:
            raise TransferError(f"the sender at {address} refused: {answer['refused']}")
        group = dist.ProcessGroupGloo(dist.PrefixStore(f"t{ticket}/", store), 1, 2,
                                      datetime.timedelta(seconds=timeout_s))
        manifest_buffer = torch.empty(answer["manifest_bytes"], dtype=torch.uint8)
        group.recv([manifest_buffer], 0, 0).wait()  # type: ignore[attr-defined]
        buffers = [(name, torch.empty(size, dtype=torch.uint8)) for name, size in answer["files"]]
        for tag, (_, buffer) in enumerate(buffers, start=1):
            group.recv([buffer], 0, tag).wait()  # type: ignore[attr-defined]
    except TransferError:
        raise
    except Exception as exc:  # noqa: BLE001 - a timeout or a dropped peer
        raise TransferError(f"receiving version {version} from {address} failed: {str(exc).splitlines()[0]}") \
            from exc
    return verified_tensors(manifest_buffer.numpy().tobytes(), manifest_sha256, buffers)


def verified_tensors(manifest_data: bytes, manifest_sha256: str, files: list[tuple[str, Any]]) -> Received:
    """The manifest and tensors of received safetensors files (name, uint8 tensor of the bytes),
    after checking the manifest against the event's digest and each file against the manifest."""
    if hashlib.sha256(manifest_data).hexdigest() != manifest_sha256:
        raise TransferError("the received manifest does not match the event's digest")
    manifest = Manifest.model_validate_json(manifest_data)
    expected = {e.name: e for e in (manifest.result or manifest.files) if e.name.endswith(".safetensors")}
    if sorted(expected) != sorted(name for name, _ in files):
        raise TransferError(f"received files {sorted(n for n, _ in files)}, the manifest lists {sorted(expected)}")
    tensors = []
    for name, data in files:
        view = data.numpy()
        if view.size != expected[name].size_bytes or hashlib.sha256(view).hexdigest() != expected[name].sha256:
            raise TransferError(f"{name}: the received bytes do not match the manifest's sha256")
        tensors += safetensors_views(data)
    return Received(manifest, tensors)


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
           "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def safetensors_views(data) -> list[tuple[str, Any]]:
    """The tensors of one safetensors file held as a uint8 tensor, as views of it (no copy; the
    format aligns each tensor to 8 bytes)."""
    import torch
    (length,) = struct.unpack("<Q", data[:8].numpy().tobytes())
    header = json.loads(data[8:8 + length].numpy().tobytes())
    start = 8 + length
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise TransferError(f"tensor {name}: dtype {info['dtype']} is not one this transfer reads")
        begin, end = info["data_offsets"]
        raw = data[start + begin: start + end]
        dtype = getattr(torch, _DTYPES[info["dtype"]])
        try:
            flat = raw.view(dtype)
        except RuntimeError:  # not aligned for the dtype (a writer that does not sort by alignment)
            flat = raw.clone().view(dtype)
        tensors.append((name, flat.reshape(info["shape"])))
    return tensors
