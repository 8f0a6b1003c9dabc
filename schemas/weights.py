"""Events of the weight path: a version published by the trainer, a replica's status.

    trainer ──WeightsPublished──▶ weights (compacted, key: policy) ──▶ weight subscribers
    weight subscriber ──ReplicaStatus──▶ fleet ──▶ dispatcher, run display
    rollwire promote / rollback ──ServingDecision──▶ serving ──▶ serving replicas, serving gateway
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from rollwire.schemas.base import Event, now_ms

ReplicaState = Literal["starting", "serving", "reloading", "failed", "stopped"]
"""What a replica is doing (`ReplicaStatus.state`)."""
WeightFormat = Literal["full", "lora"]
"""Whole weights, or a LoRA adapter over the base model."""
WeightEncoding = Literal["snapshot", "delta"]
"""How a version is stored: every file whole, or the elements changed since an earlier version
(`rollwire.core.weight_deltas`)."""

class WeightsPublished(Event):
    """A complete, verified-on-write weight version in the object store.

    Produced by the trainer on `weights` (compacted; key: policy name, so the topic keeps the
    latest version per policy); consumed by weight subscribers and the dispatcher.
    """

    type: Literal["weights.published"] = "weights.published"
    SCHEMA_VERSION: ClassVar[int] = 2
    """2: `direct` added."""
    policy: str = "policy"
    """Name of the policy being trained (the compaction key)."""
    version: int = Field(ge=0)
    """Weight version; strictly increasing per policy. Version 0 is the base model."""
    step: int = Field(ge=0)
    """Trainer step that produced these weights."""
    uri: str
    """Prefix holding the checkpoint, e.g. `s3://bucket/run/v000012/` or `file:///...`."""
    format: WeightFormat = "full"
    """Full weights, or a LoRA adapter over `base_model`."""
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex sha256 of the manifest; subscribers verify the manifest, then every file against it."""
    base_model: str = ""
    """Model the weights or adapter belong to (name or path)."""
    size_bytes: int = Field(default=0, ge=0)
    """Bytes stored for this version: the whole checkpoint for a snapshot, the delta's files for a delta."""
    full_size_bytes: int = Field(default=0, ge=0)
    """Bytes of the whole checkpoint (what a snapshot of this version would store; 0 from before deltas)."""
    encoding: WeightEncoding = "snapshot"
    """`snapshot`: every file whole. `delta`: the changes since `base_version`, which a replica
    applies to that version's files, or rebuilds from the newest snapshot before it."""
    base_version: int | None = None
    """For a delta: the version it applies to (the previous one published)."""
    base_manifest_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """For a delta: the digest of its base version's manifest."""
    published_at_ms: int = Field(default_factory=now_ms)
    """When the manifest was written (epoch ms)."""
    direct: str | None = None
    """Where the trainer also serves this version from its memory while it is the newest
    (`gloo://host:port`, `rollwire.core.weight_transfer`): a replica receives it from there with no
    object-store read, checked against the same digests, and fetches it from `uri` when it cannot."""


class ReplicaStatus(Event):
    """What one inference replica serves, or why it could not load a version.

    Produced by weight subscribers on `fleet` (key: replica id); consumed by the dispatcher and
    the run display.
    """

    type: Literal["replica.status"] = "replica.status"
    SCHEMA_VERSION: ClassVar[int] = 4
    """2: `url` added (routing reads it); a version-1 reader would refuse the field, so it is told
    the event is newer than it instead. 3: the parts of a reload, `drain_s`, `apply_s`, `stage_s`.
    4: `transfer`."""
    replica_id: str
    """Stable name of the replica (host and port, or a configured name)."""
    state: ReplicaState
    """Replica state after the change this event reports."""
    serving_version: int | None = None
    """Weight version now served; None before the first load."""
    requested_version: int | None = None
    """The version this event is about (loaded, or refused); None for start and stop."""
    bytes_downloaded: int = Field(default=0, ge=0)
    """Bytes fetched for `requested_version`."""
    download_s: float = Field(default=0.0, ge=0.0)
    """Time to download and verify the checkpoint."""
    swap_s: float = Field(default=0.0, ge=0.0)
    """Time the engine was paused for the swap (a LoRA version: the adapter's load; nothing pauses)."""
    drain_s: float = Field(default=0.0, ge=0.0)
    """Of `swap_s`: the pause request, until the engine stopped scheduling (its running step ends)."""
    apply_s: float = Field(default=0.0, ge=0.0)
    """Of `swap_s`: writing the new weights into the engine (the layer-wise reload)."""
    stage_s: float = Field(default=0.0, ge=0.0)
    """Before the pause, while serving went on: the engine's workers reading the files into memory
    (or receiving them from the trainer, for `transfer = "direct"`)."""
    transfer: Literal["store", "direct"] = "store"
    """How `requested_version` came: fetched from the object store, or received from the trainer's
    memory (`WeightsPublished.direct`)."""
    reason: str | None = None
    """Why a load failed (state `failed`); None otherwise."""
    url: str | None = None
    """Where clients reach this replica's OpenAI-compatible API (env workers route to it); None for a
    replica not offered for routing. Replicas report `serving` again every few seconds as a heartbeat."""


class ServingDecision(Event):
    """Which versions production serves: a stable version, and optionally a canary taking a share of
    requests. Training replicas follow every version on `weights`; serving replicas (`follow =
    "serving"`) load what the latest decision gives their lane, older versions included (a rollback).

    Produced by `rollwire promote` and `rollwire rollback` on `serving` (key: policy name; kept
    forever, so the decisions are the serving history); consumed by serving replicas and the gateway.
    """

    type: Literal["serving.decision"] = "serving.decision"
    SCHEMA_VERSION: ClassVar[int] = 2
    """2: its versions carry `WeightsPublished.direct`."""
    policy: str = "policy"
    """Policy the decision is about (the key)."""
    stable: WeightsPublished
    """The version that takes every request the canary does not."""
    canary: WeightsPublished | None = None
    """A newer version on trial; None: the stable version takes every request."""
    canary_share: float = Field(default=0.0, ge=0.0, le=1.0)
    """Share of requests the serving gateway sends to the canary."""
    reason: Literal["promote", "canary", "rollback"]
    """What was decided: a version made stable, one put on trial, or an earlier one served again."""
    decided_by: str = ""
    """Who decided (the command's user, or an automated check)."""
    note: str = ""
    """Why, in words (`rollwire rollback 12 --note "v14 repeats itself"`)."""

    @model_validator(mode="after")
    def _canary_is_another_version(self) -> ServingDecision:
        if self.canary is not None and self.canary.version == self.stable.version:
            raise ValueError(f"the canary is the stable version ({self.stable.version}); give another version")
        if self.canary is None and self.canary_share:
            raise ValueError("canary_share is set without a canary version")
        for version in (self.stable, self.canary):
            if version is not None and version.policy != self.policy:
                raise ValueError(f"version {version.version} is of policy {version.policy!r}, not {self.policy!r}")
        return self
