"""The object-store contract and checkpoint verification, on a local directory and a real S3
endpoint (moto's server) alike."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from builders import write_safetensors

from rollwire.core.objectstore import ObjectNotFoundError, ObjectStoreError
from rollwire.core.weight_versions import (
    CheckpointMissingError,
    CorruptCheckpointError,
    DeltaBase,
    IncompatibleCheckpointError,
    Published,
    check_compatible,
    delta_chain,
    describe,
    fetch,
    publish,
    stored_versions,
    version_prefix,
)


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_safetensors(folder / "model.safetensors", {"embed.weight": ("F32", [8, 4]), "head.weight": ("F32", [8, 4])})
    (folder / "config.json").write_text('{"hidden_size": 4}')
    return folder


def test_an_object_streams_in_chunks_and_a_missing_one_fails_before_the_first(store):
    data = bytes(range(256)) * 1000
    store.put_bytes("s/big.bin", data)
    chunks = list(store.stream("s/big.bin", chunk_bytes=4096))
    assert b"".join(chunks) == data and len(chunks) >= len(data) // 4096 and max(map(len, chunks)) <= 4096
    with pytest.raises(ObjectNotFoundError):
        store.stream("s/none.bin")


def test_objects_round_trip_and_list(store, tmp_path):
    store.put_bytes("a/b/one.bin", b"1")
    (tmp_path / "two.bin").write_bytes(b"22")
    store.put_file("a/two.bin", tmp_path / "two.bin")
    assert store.get_bytes("a/b/one.bin") == b"1"
    store.get_file("a/two.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == b"22"
    assert store.list("a/") == ["a/b/one.bin", "a/two.bin"]
    assert store.exists("a/two.bin") and not store.exists("a/none")
    assert store.key(store.uri("a/two.bin")) == "a/two.bin"
    store.delete("a/two.bin")
    with pytest.raises(ObjectNotFoundError):
        store.get_bytes("a/two.bin")
    with pytest.raises(ObjectStoreError, match="invalid"):
        store.put_bytes("../escape", b"x")


def test_a_prefix_lists_the_keys_that_start_with_it_and_a_deleted_folder_is_gone(store, tmp_path):
    for version in (1, 2, 10, 11):
        store.put_bytes(f"p/v{version:02d}/manifest.json", b"{}")
        store.put_bytes(f"p/v{version:02d}/model.bin", b"w")
    store.put_bytes("p/other.txt", b"o")
    store.put_bytes("q/v10/manifest.json", b"{}")
    assert store.list("p/v1") == ["p/v10/manifest.json", "p/v10/model.bin", "p/v11/manifest.json", "p/v11/model.bin"]
    assert store.list("p/v10/") == ["p/v10/manifest.json", "p/v10/model.bin"]
    assert store.list("p/v10/man") == ["p/v10/manifest.json"]
    assert store.list("p/x") == [] and store.list("none/") == []
    assert len(store.list("")) == 10
    for key in store.list("p/v1"):
        store.delete(key)
    assert store.list("p/") == ["p/other.txt", "p/v01/manifest.json", "p/v01/model.bin",
                                "p/v02/manifest.json", "p/v02/model.bin"]
    if hasattr(store, "root"):  # a local folder: no empty folder stays for every later listing to walk
        assert sorted(p.name for p in (store.root / "p").iterdir()) == ["other.txt", "v01", "v02"]
        for key in store.list("q/"):
            store.delete(key)
        assert not (store.root / "q").exists() and store.root.is_dir()
    store.put_bytes("q/v10/manifest.json", b"again")  # a folder a delete took comes back with a put
    assert store.get_bytes("q/v10/manifest.json") == b"again"


def test_a_published_checkpoint_fetches_verified(store, checkpoint, tmp_path):
    writes = []
    for method in ("put_file", "put_bytes"):
        original = getattr(store, method)
        setattr(store, method, lambda key, data, original=original: (writes.append(key), original(key, data)))
    published = publish(store, checkpoint, "run/v000001", policy="p", version=1, step=1, base_model="tiny")
    assert writes[-1] == "run/v000001/manifest.json" and len(writes) == 3
    assert published.manifest_sha256 == hashlib.sha256(store.get_bytes("run/v000001/manifest.json")).hexdigest()

    manifest = fetch(store, published.uri, published.manifest_sha256, tmp_path / "got")

    assert manifest.version == 1 and {f.name for f in manifest.files} == {"config.json", "model.safetensors"}
    assert (tmp_path / "got/model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
    check_compatible(manifest, {t.name: (t.dtype, t.shape) for t in describe(checkpoint)[1]})


def test_no_manifest_means_not_published(store, checkpoint, tmp_path):
    published = publish(store, checkpoint, "run/v2", policy="p", version=2, step=2)
    store.delete("run/v2/manifest.json")
    with pytest.raises(CheckpointMissingError, match="never completed"):
        fetch(store, published.uri, published.manifest_sha256, tmp_path / "got")
    assert not (tmp_path / "got").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.put_bytes("run/v3/model.safetensors", b"\x00" * 10), "bytes, the manifest says"),
    (lambda s: s.delete("run/v3/config.json"), "missing"),
    (lambda s: s.put_bytes("run/v3/config.json", b'{"hidden_size": 5}'), "sha256"),
    (lambda s: s.put_bytes("run/v3/manifest.json", s.get_bytes("run/v3/manifest.json") + b" "), "replaced or damaged"),
], ids=["truncated", "file-missing", "bytes-changed", "manifest-changed"])
def test_damaged_checkpoints_are_refused_and_leave_nothing_behind(store, checkpoint, tmp_path, damage, message):
    published = publish(store, checkpoint, "run/v3", policy="p", version=3, step=3)
    damage(store)
    with pytest.raises(CorruptCheckpointError, match=message):
        fetch(store, published.uri, published.manifest_sha256, tmp_path / "got")
    assert list(tmp_path.glob("got*")) == [] and list(tmp_path.glob(".got*")) == []


def test_parameters_that_do_not_fit_the_served_model_are_named(store, checkpoint, tmp_path):
    published = publish(store, checkpoint, "run/v4", policy="p", version=4, step=4)
    manifest = fetch(store, published.uri, published.manifest_sha256, tmp_path / "got")
    with pytest.raises(IncompatibleCheckpointError, match=r"wrong shape or dtype: \['head.weight'\]"):
        check_compatible(manifest, {"embed.weight": ("F32", [8, 4]), "head.weight": ("F32", [8, 5])})
    with pytest.raises(IncompatibleCheckpointError, match="missing: \\['lm_head.weight'\\]"):
        check_compatible(manifest, {"embed.weight": ("F32", [8, 4]), "head.weight": ("F32", [8, 4]),
                                    "lm_head.weight": ("F32", [8, 4])})


class Versions:
    """A training run's versions of one bfloat16 model on disk, published as the trainer does: a
    snapshot, then deltas against the version before, a snapshot every `snapshot_every`."""

    def __init__(self, store, folder: Path, snapshot_every: int) -> None:
        import torch
        self.store, self.folder, self.snapshot_every = store, folder, snapshot_every
        torch.manual_seed(0)
        self.weights = {"embed.weight": torch.randn(256, 64).to(torch.bfloat16),
                        "head.weight": torch.randn(64, 256).to(torch.bfloat16)}
        self.published: dict[int, Published] = {}
        self.base: DeltaBase | None = None

    def publish(self, version: int) -> Published:
        import torch
        from safetensors.torch import save_file
        self.weights = {k: (v.float() + 1e-3 * torch.randn(v.shape)).to(torch.bfloat16) for k, v in self.weights.items()}
        local = self.folder / f"v{version}"
        local.mkdir(parents=True)
        save_file(self.weights, str(local / "model.safetensors"), metadata={"format": "pt"})
        (local / "config.json").write_text('{"hidden_size": 64}')
        due = self.base is None or (version - 1) % self.snapshot_every == 0
        done = publish(self.store, local, version_prefix("p", version), policy="p", version=version, step=version,
                       base=None if due else self.base)
        self.base = DeltaBase(version, done.uri, done.manifest_sha256, local, done.manifest.result or done.manifest.files)
        self.published[version] = done
        return done

    def file(self, version: int) -> bytes:
        return (self.folder / f"v{version}" / "model.safetensors").read_bytes()


def test_a_late_replica_rebuilds_a_delta_from_the_snapshot_before_it_bit_for_bit(store, tmp_path):
    run = Versions(store, tmp_path / "trainer", snapshot_every=4)
    done = [run.publish(v) for v in range(1, 7)]
    assert [d.encoding for d in done] == ["snapshot", "delta", "delta", "delta", "snapshot", "delta"]
    assert all(d.size_bytes < 0.5 * d.full_size_bytes for d in done if d.encoding == "delta")
    assert [d.manifest.base_version for d in done] == [None, 1, 2, 3, None, 5]

    replica = tmp_path / "replica"
    late = fetch(store, done[3].uri, done[3].manifest_sha256, replica / "late-v4")  # v1 + deltas 2, 3, 4
    assert late.version == 4 and (replica / "late-v4/model.safetensors").read_bytes() == run.file(4)
    assert (replica / "late-v4/config.json").read_text() == '{"hidden_size": 64}'
    assert sorted(p.name for p in replica.iterdir()) == ["late-v4"]  # no link left behind

    reads = []
    original = store.stream
    store.stream = lambda key, *a, **k: (reads.append(key), original(key, *a, **k))[1]
    fetch(store, done[5].uri, done[5].manifest_sha256, tmp_path / "v6", has={done[4].manifest_sha256: run.folder / "v5"})
    assert (tmp_path / "v6/model.safetensors").read_bytes() == run.file(6)
    assert reads == ["p/v00000006/model.safetensors.delta"]  # the unchanged config is the base's


def test_a_corrupted_delta_is_refused_and_the_next_snapshot_recovers(store, tmp_path):
    run = Versions(store, tmp_path / "trainer", snapshot_every=3)
    done = [run.publish(v) for v in range(1, 4)]
    key = "p/v00000002/model.safetensors.delta"
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0xFF
    store.put_bytes(key, bytes(data))
    for version in (2, 3):  # v3 is a delta on the corrupted v2
        with pytest.raises(CorruptCheckpointError, match="sha256"):
            fetch(store, done[version - 1].uri, done[version - 1].manifest_sha256, tmp_path / f"replica/v{version}")
    assert list((tmp_path / "replica").iterdir()) == []
    snapshot = run.publish(4)
    assert snapshot.encoding == "snapshot"
    fetch(store, snapshot.uri, snapshot.manifest_sha256, tmp_path / "v4")
    assert (tmp_path / "v4/model.safetensors").read_bytes() == run.file(4)


def test_a_delta_on_a_base_that_is_not_the_one_published_is_refused(store, tmp_path):
    """The result's digest is checked, not only the download's: a replica whose copy of the base
    was damaged on its disk serves nothing rebuilt from it."""
    run = Versions(store, tmp_path / "trainer", snapshot_every=10)
    first, second = run.publish(1), run.publish(2)
    damaged = tmp_path / "damaged-v1"
    fetch(store, first.uri, first.manifest_sha256, damaged)
    data = bytearray((damaged / "model.safetensors").read_bytes())
    data[-1] ^= 0x01
    (damaged / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError,
                       match="model.safetensors rebuilt from the delta of version 2.*not the ones it was taken against"):
        fetch(store, second.uri, second.manifest_sha256, tmp_path / "v2", has={first.manifest_sha256: damaged})
    (damaged / "config.json").write_text('{"hidden_size": 65}')  # an unchanged file, copied from the base
    (damaged / "model.safetensors").write_bytes(run.file(1))
    with pytest.raises(CorruptCheckpointError, match="config.json rebuilt from the delta of version 2"):
        fetch(store, second.uri, second.manifest_sha256, tmp_path / "v2", has={first.manifest_sha256: damaged})
    assert not (tmp_path / "v2").exists()


def test_retention_keeps_the_versions_a_kept_delta_is_rebuilt_from(store, tmp_path):
    from rollwire.trainer.retention import Retention
    from rollwire.trainer.settings import RetentionSettings
    run = Versions(store, tmp_path / "trainer", snapshot_every=4)
    for version in range(1, 8):
        run.publish(version)  # snapshots 1 and 5
    pruned = Retention(store, "p", RetentionSettings(keep_last=2)).apply(7, in_use={3})
    assert pruned == [4] and stored_versions(store, "p") == [1, 2, 3, 5, 6, 7]
    assert delta_chain(store, "p", 7) == [7, 6, 5] and delta_chain(store, "p", 3) == [3, 2, 1]
    done = run.published[3]
    fetch(store, done.uri, done.manifest_sha256, tmp_path / "v3")
    assert (tmp_path / "v3/model.safetensors").read_bytes() == run.file(3)


def test_retention_over_a_run_reads_each_manifest_once_and_keeps_what_a_fresh_look_keeps(store, tmp_path):
    from rollwire.trainer.retention import Retention
    from rollwire.trainer.settings import RetentionSettings
    settings = RetentionSettings(keep_last=3, keep_every=10)
    run = Versions(store, tmp_path / "trainer", snapshot_every=4)
    read = []
    get_bytes = store.get_bytes
    store.get_bytes = lambda key: (read.append(key), get_bytes(key))[1]
    retention = Retention(store, "p", settings, relist_every=7)
    for version in range(1, 41):
        run.publish(version)
        retention.apply(version, in_use={5} if version < 20 else set())
    # each manifest read once, though every kept version's chain is walked at every publish
    manifests = [key for key in read if key.endswith("manifest.json")]
    assert len(manifests) == len(set(manifests)) <= 40, manifests
    store.get_bytes = get_bytes
    kept = {v for v in range(1, 41) if settings.keeps(v, 40)}
    needed = {base for v in kept for base in delta_chain(store, "p", v)}
    assert stored_versions(store, "p") == sorted(needed) and 5 not in needed and {10, 20, 30, 40} <= needed
    assert Retention(store, "p", settings).apply(40, in_use=set()) == []  # a fresh look prunes nothing more
