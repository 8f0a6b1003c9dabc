"""Weight versions in the object store: the trainer publishes each version's files with a manifest,
replicas fetch and verify them (layout: `rollwire.schemas.manifest`). The trainer's own resumable
state (model, optimizer, read positions) is something else: `rollwire.trainer.checkpoint`.

    publish(store, local_dir, prefix, ...)   every file, then manifest.json last; with `base` (the
                                             previous version's files, kept by the trainer) a
                                             delta: only the changed elements (`weight_deltas`)
    fetch(store, uri, manifest_sha256, dest) manifest digest; the files in parallel, each hashed
                                             and sized as its bytes stream in; a delta applied to
                                             its base (a folder this machine `has`, else rebuilt
                                             from the newest snapshot before it, link by link)
                                             and the result's digests checked; then each
                                             safetensors header against the manifest; only a
                                             fully verified directory appears at `dest`

Nothing here imports torch: subscribers verify bytes with the standard library (and apply deltas with numpy).

    CheckpointError
    ├── CheckpointMissingError      no manifest at the URI (not published, or not finished)
    ├── CorruptCheckpointError      a digest, size or header does not match the manifest, or a
    │                               delta does not rebuild the version it promises
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
from dataclasses import dataclass, field
from pathlib import Path

from rollwire.core import weight_deltas
from rollwire.core.errors import RollwireError
from rollwire.core.objectstore import ObjectNotFoundError, ObjectStore
from rollwire.schemas.manifest import MANIFEST_NAME, FileEntry, Manifest, TensorEntry
from rollwire.schemas.weights import WeightEncoding, WeightFormat, WeightsPublished

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
    """Bytes stored (a delta's, for a delta)."""
    manifest: Manifest
    full_size_bytes: int = 0
    """Bytes of the whole version."""
    changed_share: float | None = None
    """For a delta: the share of tensor elements whose bits changed."""
    manifest_data: bytes = b""
    """The manifest as stored (its sha256 is `manifest_sha256`)."""

    @property
    def encoding(self) -> WeightEncoding:
        return self.manifest.encoding

    def event(self, published_at_ms: int | None = None) -> WeightsPublished:
        """The `weights.published` event that announces this version."""
        m = self.manifest
        event = WeightsPublished(policy=m.policy, version=m.version, step=m.step, uri=self.uri, format=m.format,
                                 manifest_sha256=self.manifest_sha256, base_model=m.base_model,
                                 size_bytes=self.size_bytes, full_size_bytes=self.full_size_bytes, encoding=m.encoding,
                                 base_version=m.base_version, base_manifest_sha256=m.base_manifest_sha256)
        return event if published_at_ms is None else event.model_copy(update={"published_at_ms": published_at_ms})


@dataclass(frozen=True)
class DeltaBase:
    """A published version whose whole files are on this machine: what the next one is a delta against."""

    version: int
    uri: str
    """Where it is published (a delta names its base's folder beside its own)."""
    manifest_sha256: str
    folder: Path
    """Its whole files on this machine."""
    files: list[FileEntry] = field(default_factory=list)
    """Their entries (read from `folder` when empty)."""


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
            format: WeightFormat = "full", base_model: str = "", base: DeltaBase | None = None) -> Published:
    """Uploads every file of `local_dir` under `prefix`, then the manifest, and returns its digest.
    With `base`, full weights are stored as a delta against it where their layout allows (the
    result's digests in the manifest); a snapshot otherwise."""
    files, tensors = describe(local_dir)
    if not tensors:
        raise CheckpointError(f"{local_dir} holds no .safetensors file: nothing to publish")
    prefix = prefix.rstrip("/") + "/"
    with tempfile.TemporaryDirectory(prefix="rollwire-delta-") as scratch:
        delta = _delta_files(Path(local_dir), files, base, Path(scratch)) if base is not None and format == "full" \
            else None
        stored = delta[0] if delta is not None else [(entry, Path(local_dir) / entry.name) for entry in files]
        for entry, path in stored:
            store.put_file(prefix + entry.name, path)
    manifest = Manifest(policy=policy, version=version, step=step, format=format, base_model=base_model,
                        files=[entry for entry, _ in stored], tensors=tensors)
    if delta is not None and base is not None:
        manifest = manifest.model_copy(update={
            "encoding": "delta", "base_version": base.version, "base_manifest_sha256": base.manifest_sha256,
            "base_folder": store.key(base.uri).rstrip("/").rpartition("/")[2], "result": files})
    data = manifest.model_dump_json(indent=1).encode()
    store.put_bytes(prefix + MANIFEST_NAME, data)  # Last: its presence means the version is complete.
    return Published(uri=store.uri(prefix), manifest_sha256=hashlib.sha256(data).hexdigest(),
                     size_bytes=sum(f.size_bytes for f in manifest.files), manifest=manifest,
                     full_size_bytes=sum(f.size_bytes for f in files),
                     changed_share=delta[1] if delta is not None else None, manifest_data=data)


def _delta_files(local_dir: Path, files: list[FileEntry], base: DeltaBase,
                 scratch: Path) -> tuple[list[tuple[FileEntry, Path]], float] | None:
    """What a delta version stores — a `.delta` per safetensors file, every other file that changed —
    and the share of elements changed; None where the layouts differ (a snapshot is due)."""
    base_files = {f.name: f for f in base.files} or {f.name: f for f in describe(base.folder)[0]}
    if {f.name for f in files} != set(base_files):
        return None
    stored, elements, changed = [], 0, 0
    for entry in files:
        if entry.sha256 == base_files[entry.name].sha256:
            continue  # the replica has it
        if not entry.name.endswith(".safetensors"):
            stored.append((entry, local_dir / entry.name))
            continue
        out = scratch / (entry.name + weight_deltas.DELTA_SUFFIX)
        out.parent.mkdir(parents=True, exist_ok=True)
        stats = weight_deltas.encode(base.folder / entry.name, local_dir / entry.name, out,
                                     base_sha256=base_files[entry.name].sha256)
        if stats is None:
            return None
        elements, changed = elements + stats.elements, changed + stats.changed
        stored.append((FileEntry(name=out.relative_to(scratch).as_posix(), size_bytes=stats.delta_bytes,
                                 sha256=sha256_file(out)), out))
    return stored, changed / max(elements, 1)


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
    found = Published(uri=store.uri(prefix), manifest_sha256=hashlib.sha256(data).hexdigest(),
                      size_bytes=sum(f.size_bytes for f in manifest.files), manifest=manifest,
                      full_size_bytes=sum(f.size_bytes for f in manifest.result or manifest.files))
    return found.event(published_at_ms=manifest.created_at_ms).model_copy(update={"policy": policy})


def delta_chain(store: ObjectStore, policy: str, version: int,
                bases: dict[int, int | None] | None = None) -> list[int]:
    """`version` and the versions a replica needs to rebuild it: its bases back to a snapshot
    (newest first). `bases` caches, across calls, each version's base read from its manifest
    (None: a snapshot, or no manifest); a version's manifest never changes once published."""
    bases = {} if bases is None else bases
    chain = [version]
    while True:
        if chain[-1] not in bases:
            try:
                data = store.get_bytes(version_prefix(policy, chain[-1]) + "/" + MANIFEST_NAME)
            except ObjectNotFoundError:
                bases[chain[-1]] = None
            else:
                manifest = Manifest.model_validate_json(data)
                bases[chain[-1]] = manifest.base_version if manifest.encoding == "delta" else None
        base = bases[chain[-1]]
        if base is None:
            return chain
        chain.append(base)


def _ranges(versions: list[int]) -> str:
    """`1-3, 5, 9-10` for [1, 2, 3, 5, 9, 10]."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def fetch(store: ObjectStore, uri: str, manifest_sha256: str, dest: Path, *,
          has: Mapping[str, Path] | None = None) -> Manifest:
    """Downloads and verifies the checkpoint at `uri` into `dest` (which must not exist yet). A delta
    is applied to its base: a verified folder of this machine when `has` (manifest digest -> folder)
    holds it, else the base is rebuilt first, back to the newest snapshot before it."""
    chain = [(uri, manifest_sha256, _manifest(store, uri, manifest_sha256))]
    has = has or {}
    while (last := chain[-1][2]).encoding == "delta" and last.base_manifest_sha256 not in has:
        if last.base_version is None or last.base_manifest_sha256 is None:
            raise CorruptCheckpointError(f"the delta at {chain[-1][0]} names no base version")
        base_uri = _sibling(store, chain[-1][0], last.base_folder or f"v{last.base_version:08d}")
        chain.append((base_uri, last.base_manifest_sha256,
                      _manifest(store, base_uri, last.base_manifest_sha256, needed_by=last.version)))
    base = has.get(last.base_manifest_sha256 or "") if last.encoding == "delta" else None
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.chain-") as links:
        for i, (link_uri, _, manifest) in enumerate(reversed(chain)):
            staging = Path(tempfile.mkdtemp(dir=dest.parent if i == len(chain) - 1 else links,
                                            prefix=f".{dest.name}.partial-"))
            try:
                _materialize(store, link_uri, manifest, base, staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            base = staging
        assert base is not None
        try:
            os.replace(base, dest)
        finally:
            if base.exists():
                shutil.rmtree(base)
    return chain[0][2]


def _manifest(store: ObjectStore, uri: str, manifest_sha256: str, *, needed_by: int | None = None) -> Manifest:
    prefix = store.key(uri).rstrip("/") + "/"
    try:
        data = store.get_bytes(prefix + MANIFEST_NAME)
    except ObjectNotFoundError as exc:
        if needed_by is not None:
            raise CheckpointMissingError(f"version {needed_by} is a delta on the version at {uri}, which has no "
                                         f"{MANIFEST_NAME} (pruned?): it cannot be rebuilt until the next snapshot"
                                         ) from exc
        raise CheckpointMissingError(f"no {MANIFEST_NAME} at {uri}: the checkpoint was never completed, or was "
                                     "pruned by the trainer's retention ([trainer.retention])") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest_sha256:
        raise CorruptCheckpointError(f"the manifest at {uri} has sha256 {actual[:12]}…, "
                                     f"{'the weights event announced' if needed_by is None else 'its delta names'} "
                                     f"{manifest_sha256[:12]}…: it was replaced or damaged")
    return Manifest.model_validate_json(data)


def _sibling(store: ObjectStore, uri: str, folder: str) -> str:
    """The URI of the version in `folder` beside the version at `uri`."""
    parent = store.key(uri).rstrip("/").rpartition("/")[0]
    return store.uri(f"{parent}/{folder}/" if parent else f"{folder}/")


def _materialize(store: ObjectStore, uri: str, manifest: Manifest, base: Path | None, staging: Path) -> None:
    """The version of `manifest` into the empty folder `staging`, verified."""
    prefix = store.key(uri).rstrip("/") + "/"
    with concurrent.futures.ThreadPoolExecutor(min(_PARALLEL_FILES, max(1, len(manifest.files)))) as pool:
        for done in [pool.submit(_download, store, prefix, entry, staging, uri) for entry in manifest.files]:
            done.result()  # the first failure, after every download has ended
    if manifest.encoding == "delta":
        assert base is not None
        stored = {f.name for f in manifest.files}
        for entry in manifest.result:
            target, patch = staging / entry.name, entry.name + weight_deltas.DELTA_SUFFIX
            if patch in stored:
                try:
                    weight_deltas.apply(base / entry.name, staging / patch, target, check_base=False)
                except (weight_deltas.DeltaError, FileNotFoundError) as exc:
                    raise CorruptCheckpointError(f"the delta of version {manifest.version} ({uri}) does not "
                                                 f"apply: {exc}") from exc
                (staging / patch).unlink()
            elif entry.name not in stored:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(base / entry.name, target)
            if target.stat().st_size != entry.size_bytes or sha256_file(target) != entry.sha256:
                raise CorruptCheckpointError(f"{entry.name} rebuilt from the delta of version {manifest.version} "
                                             f"({uri}) differs from the version the trainer published: the base "
                                             f"version's files here are not the ones it was taken against")
    _verify_tensors(staging, manifest, uri)


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
