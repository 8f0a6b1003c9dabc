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
    IncompatibleCheckpointError,
    check_compatible,
    describe,
    fetch,
    publish,
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
