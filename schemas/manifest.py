"""The checkpoint manifest: what a weight version holds, written last so its presence means done.

    <prefix>/v000012/model.safetensors
    <prefix>/v000012/config.json            (full checkpoints: whatever the loader needs)
    <prefix>/v000012/manifest.json          this model, as JSON, written after every other file
    <prefix>/v000013/model.safetensors.delta  a delta version: the elements changed since v000012

Written by the trainer (`rollwire.core.weight_versions.publish`); read and verified by weight subscribers
(`rollwire.core.weight_versions.fetch`) before any byte reaches an inference engine. Its sha256 travels in
the `WeightsPublished` event, so a replaced or damaged manifest is refused too.
"""

from __future__ import annotations

from pydantic import Field

from rollwire.schemas.base import Part, now_ms
from rollwire.schemas.weights import WeightEncoding, WeightFormat

MANIFEST_NAME = "manifest.json"


class FileEntry(Part):
    """One file of the checkpoint."""

    name: str
    """Path relative to the checkpoint prefix, e.g. `model.safetensors`."""
    size_bytes: int = Field(ge=0)
    """Exact size."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex sha256 of the file's bytes."""


class TensorEntry(Part):
    """One parameter stored in a safetensors file of the checkpoint."""

    name: str
    """Parameter name as the model's `state_dict` (or the adapter) names it."""
    dtype: str
    """safetensors dtype code, e.g. `F32`, `BF16`."""
    shape: list[int]
    """Tensor shape."""
    file: str
    """The file holding it."""


class Manifest(Part):
    """Everything a subscriber needs to verify a checkpoint before loading it."""

    manifest_version: int = 1
    """Layout version of this manifest."""
    policy: str
    """Name of the policy (the weights topic key)."""
    version: int = Field(ge=0)
    """Weight version."""
    step: int = Field(ge=0)
    """Trainer step that produced it."""
    format: WeightFormat
    """Full weights, or a LoRA adapter over `base_model`."""
    base_model: str
    """The model these weights belong to (name or path)."""
    files: list[FileEntry]
    """Every file stored for this version except the manifest (for a delta: its `.delta` files and
    the other files that changed)."""
    tensors: list[TensorEntry]
    """Every tensor in the checkpoint's safetensors files."""
    encoding: WeightEncoding = "snapshot"
    """`snapshot`: `files` are the version. `delta`: `files` rebuild `result` from the base version's."""
    base_version: int | None = None
    """For a delta: the version it applies to."""
    base_manifest_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """For a delta: the digest of the base version's manifest (the chain is verified link by link)."""
    base_folder: str | None = None
    """For a delta: the base version's folder, beside this one's (e.g. `v00000012`)."""
    result: list[FileEntry] = Field(default_factory=list)
    """For a delta: every file of the whole version it rebuilds, with its digest: a replica verifies
    what it reconstructed, not only what it downloaded."""
    created_at_ms: int = Field(default_factory=now_ms)
    """When the manifest was written (epoch ms)."""
