"""Beside each vLLM server: follow the weights topic and hot-reload every verified version.

    reads:  <prefix>.weights   (compacted; no consumer group: every replica reads every version)
            <prefix>.serving   instead, for a serving replica (`follow = "serving"`)
    writes: <prefix>.fleet     (ReplicaStatus, key: replica id)

A training replica follows every version the trainer publishes. A serving replica follows the
decisions on `serving` (`rollwire promote`, `rollwire rollback`): it loads the version its lane
gets, the decision's stable version or, in the `canary` lane, its canary, older ones included.

For each `WeightsPublished` of its policy, newest first on start (catch-up) and then as they come:

    # Step 1  ignore the served version sent again; refuse older ones (an old event arriving late),
    #         unless a serving decision names it
    # Step 2  a version offered directly (`direct`): the engine's workers receive it from the trainer's
    #         memory over gloo and verify it against the same digests, then Steps 3-5; the store
    #         path below when that fails. Otherwise:
    #         download into a fresh cache folder and verify: manifest digest, every file's size and
    #         sha256, safetensors headers (`rollwire.core.weight_versions.fetch`); a delta is applied
    #         to the served version's folder (or, when that is not its base, rebuilt from the
    #         snapshot before it) and the result checked against the digests the trainer wrote
    # Step 3  full weights: names, dtypes and shapes must equal the served model's
    # Step 4  swap: full -> pause(keep), reload, label, reset prefix cache, resume;
    #         LoRA -> load under a new adapter name; the previous adapter leaves after a grace period
    # Step 5  publish `serving` with bytes, download and swap latency

Any failure in Steps 1-3 leaves the engine untouched and publishes `failed` with the reason, so
the replica keeps serving the version it has.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwire.consumers.vllm_control import SwapTimes, VllmControl, VllmError
from rollwire.core import metrics, telemetry
from rollwire.core.bus import AtOffsets, DeadLetters, EventConsumer, EventLog, EventProducer
from rollwire.core.objectstore import ObjectStore, ObjectStoreError
from rollwire.core.weight_versions import CheckpointError, check_compatible, describe, fetch
from rollwire.schemas.envelope import Codec
from rollwire.schemas.errors import SchemaError
from rollwire.schemas.manifest import Manifest
from rollwire.schemas.topics import Topics
from rollwire.schemas.weights import ReplicaState, ReplicaStatus, ServingDecision, WeightsPublished

logger = logging.getLogger(__name__)


class WeightSubscriberSettings(BaseModel):
    """Settings of one replica's weight subscriber."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    replica_id: str
    """Stable name of this replica in status events."""
    policy: str = "policy"
    """Policy whose versions this replica serves (the weights topic key)."""
    cache_dir: Path = Path("runs/default/replica-cache")
    """Where verified checkpoints are kept on this machine."""
    keep_versions: int = Field(default=2, ge=1)
    """Verified versions kept on disk (the served one and its predecessors)."""
    direct_weights: bool = True
    """Receive a version from the trainer's memory when its event offers that (`WeightsPublished.direct`,
    a trainer with `[trainer.direct] enabled`): no object-store read, the same digests checked; the
    store is the fallback. False: always fetch from the store."""
    stage_weights: bool = True
    """Have the engine read a full version into host memory while it still serves, so that the pause
    only copies it in; it holds one more copy of the weights in host memory meanwhile. False: the
    engine reads the files inside the pause (a host short of memory for a large model)."""
    lora_grace_s: float = Field(default=30.0, ge=0)
    """Seconds an old LoRA adapter stays loaded after a new one, for requests still using it."""
    url: str | None = None
    """Where env workers reach this replica's server, reported on `fleet` for routing; default (in a
    `Replica`) the server's own URL. A URL others cannot reach keeps the replica out of their pools."""
    heartbeat_s: float = Field(default=10.0, gt=0)
    """With nothing else reported for this long, `serving` is reported again: routers drop a replica
    silent for 30 s (`rollwire.producers.routing.MEMBER_TTL_S`)."""
    follow: Literal["weights", "serving"] = "weights"
    """`weights`: every version the trainer publishes (a training replica). `serving`: the versions
    production is decided to serve (`ServingDecision`), older ones on a rollback (a serving replica)."""
    lane: Literal["stable", "canary"] = "stable"
    """With `follow = "serving"`: which version of a decision this replica loads. A canary replica
    serves the stable version while no canary is on trial."""


class WeightSubscriber:
    """Applies weight versions to one vLLM server and reports each outcome."""

    def __init__(self, log: EventLog, topics: Topics, store: ObjectStore, control: VllmControl,
                 settings: WeightSubscriberSettings, *, base_model_dir: Path | None = None,
                 producer: EventProducer | None = None) -> None:
        self.log, self.topics, self.store, self.control, self.settings = log, topics, store, control, settings
        self.producer = producer or EventProducer(log.producer(), topics, name=f"replica/{settings.replica_id}")
        self.expected = ({t.name: (t.dtype, t.shape) for t in describe(base_model_dir)[1]}
                         if base_model_dir is not None else None)
        self.serving: WeightsPublished | None = None
        self.serving_dir: Path | None = None
        self._retiring: list[tuple[float, str]] = []  # (unload at, adapter name)
        self._codec = Codec()
        self._dead_letters = DeadLetters(self.producer, f"replica/{settings.replica_id}")
        self._reader: EventConsumer | None = None
        self._reported_at = 0.0
        self._state = "starting"
        self._reload_duration = metrics.seconds_histogram(
            "rollwire.weights.reload.duration", "seconds to download, verify and swap in one weight version")
        self._pause_duration = metrics.seconds_histogram(
            "rollwire.weights.pause.duration", "seconds a replica's engine was paused to swap in one weight version")

    @property
    def serving_version(self) -> int | None:
        return self.serving.version if self.serving else None

    def lora_name(self, version: int) -> str:
        return f"{self.settings.policy}-v{version}"

    @property
    def topic(self) -> str:
        """The topic followed: `weights`, or `serving` for a serving replica."""
        return self.topics.serving if self.settings.follow == "serving" else self.topics.weights

    def catch_up(self) -> ReplicaStatus | None:
        """Applies the newest published version, or the latest decision's (if any), and starts
        following from there."""
        ends = self.log.end_offsets(self.topic)
        latest = self._latest()
        reader = self.log.reader([self.topic], AtOffsets({(self.topic, p): o for p, o in ends.items()}))
        self._reader = EventConsumer(reader, self._dead_letters)
        return None if latest is None else self._take(latest)

    def _latest(self):
        """The newest event of this replica's policy on its topic (compacted: one per policy), or None."""
        latest = self.log.latest_per_key(self.topic).get(self.settings.policy.encode())
        if latest is None or latest.value is None:
            return None
        try:
            return self._codec.decode(latest.value).event
        except SchemaError as exc:
            self._dead_letters.send(latest, exc, stage="decode")
            self._dead_letters.flush()
            return None

    def _take(self, event) -> ReplicaStatus | None:
        """Applies a weights event, or the version a serving decision gives this replica's lane."""
        if self.settings.follow == "serving":
            if not isinstance(event, ServingDecision):
                return None
            target = event.canary if self.settings.lane == "canary" and event.canary is not None else event.stable
            return self.apply(target, decided=True)
        return self.apply(event) if isinstance(event, WeightsPublished) else None

    def poll(self, timeout_s: float = 1.0) -> list[ReplicaStatus]:
        """Applies versions published since the last call; unloads retired adapters. A record that is
        not a weights event goes to the dead-letter topic (`EventConsumer`); the replica goes on."""
        if self._reader is None:
            raise RuntimeError("call catch_up() first")
        statuses = []
        for delivery in self._reader.poll_batch(100, timeout_s):
            event = delivery.event
            if delivery.record.key != self.settings.policy.encode():
                continue
            expected = ServingDecision if self.settings.follow == "serving" else WeightsPublished
            if not isinstance(event, expected):
                self._reader.dead_letter(delivery, f"a {event.type} event on {self.topic}, where this replica "
                                                   f"expects {expected.model_fields['type'].default}")
                continue
            with self._reader.process_span(delivery):
                status = self._take(event)
            if status is not None:
                statuses.append(status)
        self._dead_letters.flush()
        self._unload_retired()
        return statuses

    def apply(self, event: WeightsPublished, *, decided: bool = False) -> ReplicaStatus | None:
        """Steps 1-5 for one version; None when it is the version already served (a re-sent event).
        `decided`: a serving decision names it, so an older version is loaded too (a rollback)."""
        # Step 1
        if self.serving is not None and (event.version, event.manifest_sha256) == \
                (self.serving.version, self.serving.manifest_sha256):
            return None
        if self.serving is not None and event.version <= self.serving.version and not decided:
            return self._report("failed", event, reason=f"version {event.version} is not newer than the served "
                                                        f"version {self.serving.version}; keeping it")
        if event.direct and self.settings.direct_weights and event.format == "full":
            status = self._apply_received(event)
            if status is not None:
                return status
        started = time.perf_counter()
        target = self.settings.cache_dir / f"v{event.version:08d}"
        try:
            # Step 2
            if target.exists():
                shutil.rmtree(target)
            has = ({self.serving.manifest_sha256: self.serving_dir}
                   if self.serving is not None and self.serving_dir is not None and self.serving.format == "full" else {})
            if event.encoding == "delta" and event.base_manifest_sha256 not in has:
                logger.info("replica %s: version %d is a delta on version %s, which it does not serve: rebuilding "
                            "it from the snapshot before it", self.settings.replica_id, event.version,
                            event.base_version)
            manifest = fetch(self.store, event.uri, event.manifest_sha256, target, has=has)
            self._check(manifest, event)  # Step 3
        except (CheckpointError, ObjectStoreError) as exc:
            shutil.rmtree(target, ignore_errors=True)
            return self._report("failed", event, reason=f"{type(exc).__name__}: {exc}")
        download_s = time.perf_counter() - started
        # Step 4
        try:
            with self._reload_span(event, "store"):
                swap = self._swap(event, target)
        except VllmError as exc:
            return self._report("failed", event, reason=f"the engine refused the swap: {exc}")
        return self._served(event, target, swap, bytes_downloaded=sum(f.size_bytes for f in manifest.files),
                            download_s=download_s)

    def _apply_received(self, event: WeightsPublished) -> ReplicaStatus | None:
        """Steps 2-5 over the direct path: the engine's workers receive the version from the trainer's
        memory (`WeightsPublished.direct`), verified against the event's digests; Step 3 checks the
        manifest that came with it before the pause. None when it could not be received, the engine
        untouched: the caller fetches the version from the store instead."""
        try:
            with self._reload_span(event, "direct"):
                swap = self.control.swap_received_weights(
                    event.direct or "", event.version, event.manifest_sha256, str(event.version),
                    who=self.settings.replica_id,
                    check=lambda manifest: self._check(Manifest.model_validate_json(manifest), event))
        except (VllmError, CheckpointError) as exc:
            logger.warning("replica %s: version %d could not come directly from %s (%s); fetching it from the store",
                           self.settings.replica_id, event.version, event.direct, exc)
            return None
        return self._served(event, None, swap, bytes_downloaded=0, download_s=0.0, transfer="direct")

    def _check(self, manifest: Manifest, event: WeightsPublished) -> None:
        """Step 3: the manifest is the event's version, and full weights fit the served model."""
        if manifest.version != event.version or manifest.format != event.format:
            raise CheckpointError(f"the manifest describes version {manifest.version} ({manifest.format}), "
                                  f"the event version {event.version} ({event.format})")
        if event.format == "full" and self.expected is not None:
            check_compatible(manifest, self.expected)

    def _reload_span(self, event: WeightsPublished, transfer: str):
        return telemetry.tracer().start_as_current_span(
            "reload weights", attributes={"rollwire.replica_id": self.settings.replica_id,
                                          "rollwire.weight_version": event.version,
                                          "rollwire.weight_format": event.format, "rollwire.transfer": transfer})

    def _served(self, event: WeightsPublished, folder: Path | None, swap: SwapTimes, *, bytes_downloaded: int,
                download_s: float, transfer: Literal["store", "direct"] = "store") -> ReplicaStatus:
        """Step 5: records the version served (its files in `folder`; None when received directly)."""
        previous = self.serving
        self.serving, self.serving_dir = event, folder
        self._prune_cache()
        logger.info("replica %s serves version %d (was %s, %s)", self.settings.replica_id, event.version,
                    previous.version if previous else None, transfer)
        attributes = {"rollwire.replica_id": self.settings.replica_id, "rollwire.weight_format": event.format}
        self._reload_duration.record(download_s + swap.stage_s + swap.paused_s, attributes)
        self._pause_duration.record(swap.paused_s, attributes)
        return self._report("serving", event, bytes_downloaded=bytes_downloaded, download_s=download_s,
                            transfer=transfer, **self._figures(swap))

    def _swap(self, event: WeightsPublished, folder: Path) -> SwapTimes:
        if event.format == "full":
            swap = self.control.swap_full_weights(str(folder.resolve()), str(event.version),
                                                  stage=self.settings.stage_weights)
            if self.settings.stage_weights and not swap.staged:
                logger.warning("replica %s: the engine read version %d inside the pause (its worker extension "
                               "does not stage weights: restart the server with this rollwire's)",
                               self.settings.replica_id, event.version)
            return swap
        started = time.perf_counter()
        self.control.load_lora(self.lora_name(event.version), str(folder.resolve()))
        if self.serving is not None and self.serving.format == "lora":
            self._retiring.append((time.monotonic() + self.settings.lora_grace_s,
                                   self.lora_name(self.serving.version)))
        return SwapTimes(drain_s=0.0, apply_s=time.perf_counter() - started, paused_s=0.0)

    @staticmethod
    def _figures(swap: SwapTimes) -> dict[str, Any]:
        """A swap's times as `ReplicaStatus` fields (a LoRA load pauses nothing: its time is the load's)."""
        return {"swap_s": swap.paused_s or swap.apply_s, "drain_s": swap.drain_s, "apply_s": swap.apply_s,
                "stage_s": swap.stage_s}

    def reapply(self) -> ReplicaStatus | None:
        """Loads the served version again into a freshly restarted server, then the newest one on
        the topic: a version whose swap failed because the server had died (refused, kept the
        served one) is not published again, and the dispatcher waits for the fleet to reach it."""
        status = None
        if self.serving is not None and self.serving_dir is None:  # it came directly: the store has it
            received, self.serving = self.serving, None
            status = self.apply(received, decided=True)
        elif self.serving is not None and self.serving_dir is not None:
            try:
                swap = self._swap(self.serving, self.serving_dir)
            except VllmError as exc:
                return self._report("failed", self.serving, reason=f"reloading after a restart failed: {exc}")
            status = self._report("serving", self.serving, **self._figures(swap))
        latest = self._latest()
        newer = self._take(latest) if latest is not None else None
        return newer or status

    def _unload_retired(self) -> None:
        now = time.monotonic()
        for due, name in [r for r in self._retiring if r[0] <= now]:
            try:
                self.control.unload_lora(name)
            except VllmError as exc:
                logger.warning("unloading adapter %s failed: %s", name, exc)
            self._retiring.remove((due, name))

    def _prune_cache(self) -> None:
        folders = sorted(p for p in self.settings.cache_dir.glob("v*") if p.is_dir() and p != self.serving_dir)
        for old in folders[: max(0, len(folders) - (self.settings.keep_versions - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    def _report(self, state: ReplicaState, event: WeightsPublished | None, *, reason: str | None = None,
                **figures: Any) -> ReplicaStatus:
        status = ReplicaStatus(replica_id=self.settings.replica_id, state=state,
                               serving_version=self.serving_version,
                               requested_version=event.version if event else None, reason=reason,
                               url=self.settings.url, **figures)
        self._reported_at, self._state = time.monotonic(), state
        if reason:
            logger.warning("replica %s: %s", self.settings.replica_id, reason)
        self.producer.send(self.topics.fleet, status, key=self.settings.replica_id)
        self.producer.flush()
        return status

    def report(self, state: ReplicaState, reason: str | None = None) -> ReplicaStatus:
        """Publishes a lifecycle status (`starting`, `serving`, `stopped`, or `failed` with a reason)."""
        return self._report(state, None, reason=reason)

    def heartbeat(self) -> ReplicaStatus | None:
        """Reports `serving` again after `heartbeat_s` of silence while the server serves (a failed
        load leaves the served version serving), so routers keep this replica in their pools."""
        if time.monotonic() - self._reported_at < self.settings.heartbeat_s or self._state in ("starting", "stopped"):
            return None
        return self._report("serving", None)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self.producer.close()
