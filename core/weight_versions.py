"""Weight versions in the object store: the trainer publishes each version's files with a manifest,
replicas fetch and verify them (layout: `rollwire.schemas.manifest`). The trainer's own resumable
state (model, optimizer, read positions) is something else: `rollwire.trainer.checkpoint`.

    publish(store, local_dir, prefix, ...)   every file, then manifest.json last
    fetch(store, uri, manifest_sha256, dest) manifest digest; the files in parallel, each hashed
                                             and sized as its bytes stream in; then each
                                             safetensors header against the manifest; only a
                                             fully verified directory appears at `dest`

Nothing here imports torch: subscribers verify bytes with the standard library alone.

    CheckpointError
    ├── CheckpointMissingError      no manifest at the URI (not published, or not finished)
    ├── CorruptCheckpointError      a digest, size or header does not match the manifest
    └── IncompatibleCheckpointError names, dtypes or shapes differ from the served model
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rollwire.core.errors import RollwireError
from rollwire.core.objectstore import ObjectNotFoundError, ObjectStore
from rollwire.schemas.manifest import MANIFEST_NAME, FileEntry, Manifest, TensorEntry
from rollwire.schemas.weights import WeightFormat, WeightsPublished

_CHUNK = 1 << 20
_PARALLEL_FILES = 4
"""Files of one checkpoint downloaded at once."""


class CheckpointError(RollwireError):
    """A checkpoint cannot be used; the message says what is wrong with it."""


class CheckpointMissingError(CheckpointError):
    """There is no manifest at the URI."""


class CorruptCheckpointError(CheckpointError):
    """The bytes do not match the manifest."""


class IncompatibleCheckpointError(CheckpointError):
    """The checkpoint's parameters do not fit the model being served."""


@dataclass(frozen=True)
class Published:
    """Where a checkpoint went and how to verify it."""

    uri: str
    manifest_sha256: str
    size_bytes: int
    manifest: Manifest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def safetensors_header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """Tensor name -> (dtype, shape), read from a safetensors file's JSON header."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise CorruptCheckpointError(f"{path.name} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * _CHUNK:
            raise CorruptCheckpointError(f"{path.name} claims a {length}-byte header: not a safetensors file")
        try:
            header = json.loads(f.read(length))
        except ValueError as exc:
            raise CorruptCheckpointError(f"{path.name} has an unreadable safetensors header") from exc
    return {name: (info["dtype"], list(info["shape"])) for name, info in header.items() if name != "__metadata__"}


def describe(local_dir: Path) -> tuple[list[FileEntry], list[TensorEntry]]:
    """File entries (size, sha256) and tensor entries of every file in `local_dir`."""
    files, tensors = [], []
    for path in sorted(p for p in Path(local_dir).rglob("*") if p.is_file() and p.name != MANIFEST_NAME):
        name = path.relative_to(local_dir).as_posix()
        files.append(FileEntry(name=name, size_bytes=path.stat().st_size, sha256=sha256_file(path)))
        if path.suffix == ".safetensors":
            tensors += [TensorEntry(name=t, dtype=d, shape=s, file=name)
                        for t, (d, s) in safetensors_header(path).items()]
    return files, tensors


def publish(store: ObjectStore, local_dir: Path, prefix: str, *, policy: str, version: int, step: int,
            format: WeightFormat = "full", base_model: str = "") -> Published:
    """Uploads every file of `local_dir` under `prefix`, then the manifest, and returns its digest."""
    files, tensors = describe(local_dir)
    if not tensors:
        raise CheckpointError(f"{local_dir} holds no .safetensors file: nothing to publish")
    prefix = prefix.rstrip("/") + "/"
    for entry in files:
        store.put_file(prefix + entry.name, Path(local_dir) / entry.name)
    manifest = Manifest(policy=policy, version=version, step=step, format=format, base_model=base_model,
                        files=files, tensors=tensors)
    data = manifest.model_dump_json(indent=1).encode()
    store.put_bytes(prefix + MANIFEST_NAME, data)  # Last: its presence means the version is complete.
    return Published(uri=store.uri(prefix), manifest_sha256=hashlib.sha256(data).hexdigest(),
                     size_bytes=sum(f.size_bytes for f in files), manifest=manifest)


def version_prefix(policy: str, version: int) -> str:
    """Where version `version` of `policy` lives in the object store."""
    return f"{policy}/v{version:08d}"


def stored_versions(store: ObjectStore, policy: str) -> list[int]:
    """The complete versions of `policy` in the store (those with a manifest), ascending."""
    versions = []
    for key in store.list(f"{policy}/v"):
        folder, _, name = key[len(policy) + 1:].partition("/")
        if name == MANIFEST_NAME and folder[1:].isdigit():
            versions.append(int(folder[1:]))
    return sorted(versions)


def prune_version(store: ObjectStore, policy: str, version: int) -> None:
    """Deletes a version: its manifest first (from then on it is absent to every reader), then its files."""
    prefix = version_prefix(policy, version) + "/"
    store.delete(prefix + MANIFEST_NAME)
    for key in store.list(prefix):
        store.delete(key)


def stored_version(store: ObjectStore, policy: str, version: int) -> WeightsPublished:
    """The event announcing a version already in the store, rebuilt from its manifest (the `weights`
    topic keeps only the newest version per policy); `CheckpointMissingError` if it is not there."""
    prefix = version_prefix(policy, version) + "/"
    try:
        data = store.get_bytes(prefix + MANIFEST_NAME)
    except ObjectNotFoundError as exc:
        kept = stored_versions(store, policy)
        raise CheckpointMissingError(f"version {version} of policy {policy!r} is not in the store (no "
                                     f"{prefix}{MANIFEST_NAME}: never published, or pruned by the trainer's "
                                     f"retention); the store holds {_ranges(kept) or 'no version'}") from exc
    manifest = Manifest.model_validate_json(data)
    return WeightsPublished(policy=policy, version=version, step=manifest.step, uri=store.uri(prefix),
                            format=manifest.format, manifest_sha256=hashlib.sha256(data).hexdigest(),
                            base_model=manifest.base_model, size_bytes=sum(f.size_bytes for f in manifest.files),
                            published_at_ms=manifest.created_at_ms)


def _ranges(versions: list[int]) -> str:
    """`1-3, 5, 9-10` for [1, 2, 3, 5, 9, 10]."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def fetch(store: ObjectStore, uri: str, manifest_sha256: str, dest: Path) -> Manifest:
    """Downloads and verifies the checkpoint at `uri` into `dest` (which must not exist yet)."""
    prefix = store.key(uri).rstrip("/") + "/"
    try:
        data = store.get_bytes(prefix + MANIFEST_NAME)
    except ObjectNotFoundError as exc:
        raise CheckpointMissingError(f"no {MANIFEST_NAME} at {uri}: the checkpoint was never completed, or was "
                                     "pruned by the trainer's retention ([trainer.retention])") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest_sha256:
        raise CorruptCheckpointError(f"the manifest at {uri} has sha256 {actual[:12]}…, the weights event "
                                     f"announced {manifest_sha256[:12]}…: it was replaced or damaged")
    manifest = Manifest.model_validate_json(data)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.partial-"))
    try:
        with concurrent.futures.ThreadPoolExecutor(min(_PARALLEL_FILES, max(1, len(manifest.files)))) as pool:
            for done in [pool.submit(_download, store, prefix, entry, staging, uri) for entry in manifest.files]:
                done.result()  # the first failure, after every download has ended
        _verify_tensors(staging, manifest, uri)
        os.replace(staging, dest)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return manifest


def _download(store: ObjectStore, prefix: str, entry: FileEntry, staging: Path, uri: str) -> None:
    """One file into `staging`, hashed as its bytes arrive: verifying costs no second pass."""
    target = staging / entry.name
    target.parent.mkdir(parents=True, exist_ok=True)
    digest, size = hashlib.sha256(), 0
    try:
        with open(target, "wb") as out:
            for chunk in store.stream(prefix + entry.name, _CHUNK):
                size += len(chunk)
                if size > entry.size_bytes:
                    break
                digest.update(chunk)
                out.write(chunk)
    except ObjectNotFoundError as exc:
        raise CorruptCheckpointError(f"{entry.name} is listed in the manifest of {uri} but missing") from exc
    if size != entry.size_bytes:
        raise CorruptCheckpointError(f"{entry.name} of {uri} is {'over ' if size > entry.size_bytes else ''}{size} "
                                     f"bytes, the manifest says {entry.size_bytes}")
    if digest.hexdigest() != entry.sha256:
        raise CorruptCheckpointError(f"{entry.name} of {uri} has sha256 {digest.hexdigest()[:12]}…, the manifest "
                                     f"says {entry.sha256[:12]}…")


def _verify_tensors(folder: Path, manifest: Manifest, uri: str) -> None:
    found = {}
    for name in {t.file for t in manifest.tensors}:
        for tensor, (dtype, shape) in safetensors_header(folder / name).items():
            found[tensor] = (dtype, shape, name)
    listed = {t.name: (t.dtype, t.shape, t.file) for t in manifest.tensors}
    if found != listed:
        differ = sorted(set(found) ^ set(listed)) or sorted(k for k in listed if found.get(k) != listed[k])
        raise CorruptCheckpointError(f"tensors of {uri} differ from its manifest: {differ[:5]}")


def check_compatible(manifest: Manifest, expected: Mapping[str, tuple[str, list[int]]]) -> None:
    """Raises `IncompatibleCheckpointError` unless `manifest` holds exactly the `expected`
    parameters (name -> (dtype, shape)) of the served model."""
    got = {t.name: (t.dtype, t.shape) for t in manifest.tensors}
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = sorted(n for n in set(got) & set(expected) if tuple(got[n][1]) != tuple(expected[n][1])
                   or got[n][0] != expected[n][0])
    if missing or extra or wrong:
        parts = [f"{label}: {names[:3]}{' …' if len(names) > 3 else ''}"
                 for label, names in (("missing", missing), ("unexpected", extra), ("wrong shape or dtype", wrong))
                 if names]
        raise IncompatibleCheckpointError(f"version {manifest.version} does not fit the served model "
                                          f"({'; '.join(parts)})")
