"""The direct path: a published version goes from the trainer's memory to a receiver over a real
gloo group on loopback, checked against the digests in the store's manifest, or is refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from rollwire.core.objectstore import LocalStore
from rollwire.core.weight_transfer import TransferError, WeightSender, receive
from rollwire.core.weight_versions import DeltaBase, publish


def version_folder(folder: Path, seed: int, base: Path | None = None) -> Path:
    """A checkpoint with float32, bfloat16 and integer tensors; from `base`, 2% of elements nudged."""
    folder.mkdir(parents=True)
    if base is None:
        generator = torch.Generator().manual_seed(seed)
        tensors = {"layer.weight": torch.randn(64, 48, generator=generator),
                   "layer.bias": torch.randn(48, generator=generator).to(torch.bfloat16),
                   "embed.weight": torch.randn(100, 16, generator=generator).to(torch.bfloat16),
                   "steps": torch.arange(7, dtype=torch.int64)}
    else:
        tensors = load_file(base / "model.safetensors")
        flat = tensors["embed.weight"].view(-1)
        flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(seed))[: flat.numel() // 50]] += 1
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"seed": seed}))
    return folder


@pytest.fixture
def sender():
    sender = WeightSender(timeout_s=10)
    yield sender
    sender.close()


def published(tmp_path: Path, version: int, folder: Path, base=None):
    store = LocalStore(tmp_path / "store")
    return publish(store, folder, f"policy/v{version:08d}", policy="policy", version=version, step=version, base=base)


def test_a_version_arrives_bit_for_bit_with_its_manifest(tmp_path, sender):
    folder = version_folder(tmp_path / "v1", seed=1)
    done = published(tmp_path, 1, folder)
    sender.offer(1, folder, done.manifest_data)

    received = receive(sender.address, 1, done.manifest_sha256, who="test")

    expected = load_file(folder / "model.safetensors")
    assert {name for name, _ in received.tensors} == set(expected)
    for name, tensor in received.tensors:
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name]), name
    assert received.manifest.version == 1 and received.manifest.tensors == done.manifest.tensors
    assert sender.sent == 1


def test_a_delta_version_is_sent_whole_and_checked_against_the_digests_of_its_result(tmp_path, sender):
    first = version_folder(tmp_path / "v1", seed=1)
    base = published(tmp_path, 1, first)
    second = version_folder(tmp_path / "v2", seed=2, base=first)
    done = published(tmp_path, 2, second, base=DeltaBase(1, base.uri, base.manifest_sha256, first))
    assert done.encoding == "delta" and done.size_bytes < done.full_size_bytes / 2
    sender.offer(2, second, done.manifest_data)

    received = dict(receive(sender.address, 2, done.manifest_sha256).tensors)

    assert torch.equal(received["embed.weight"], load_file(second / "model.safetensors")["embed.weight"])


def test_a_version_not_held_is_refused_with_what_is_held(tmp_path, sender):
    first = version_folder(tmp_path / "v1", seed=1)
    old = published(tmp_path, 1, first)
    sender.offer(1, first, old.manifest_data)
    second = version_folder(tmp_path / "v2", seed=2)
    new = published(tmp_path, 2, second)
    sender.offer(2, second, new.manifest_data)  # replaces version 1

    with pytest.raises(TransferError, match="refused: the trainer holds version 2, not version 1"):
        receive(sender.address, 1, old.manifest_sha256)
    with pytest.raises(TransferError, match="refused"):
        receive(sender.address, 2, old.manifest_sha256)  # the right number, another manifest
    assert len(receive(sender.address, 2, new.manifest_sha256).tensors) == 4  # the sender goes on


def test_bytes_that_differ_from_the_manifest_are_refused(tmp_path, sender):
    folder = version_folder(tmp_path / "v1", seed=1)
    done = published(tmp_path, 1, folder)
    sender.offer(1, folder, done.manifest_data)
    sender._offered.files[0][1][-3] ^= 0xFF  # the held copy is damaged after the store's was written

    with pytest.raises(TransferError, match="model.safetensors: the received bytes do not match the manifest's sha256"):
        receive(sender.address, 1, done.manifest_sha256)


def test_no_sender_is_a_quick_clear_error(tmp_path):
    sender = WeightSender()
    address = sender.address
    sender.close()  # still referenced here: closing alone must stop the answers
    started = time.monotonic()
    with pytest.raises(TransferError, match="no weight sender at gloo://"):
        receive(address, 1, "0" * 64, connect_timeout_s=1)
    assert time.monotonic() - started < 10
    with pytest.raises(TransferError, match="not a direct weight address"):
        receive("s3://bucket/x", 1, "0" * 64)


def test_transfers_leave_nothing_behind_in_the_senders_store(tmp_path, sender):
    """The trainer's rendezvous store lives as long as the run: a key left by each version would
    grow it by thousands of keys a day (four a transfer, before they were deleted)."""
    folder = version_folder(tmp_path / "v1", seed=1)
    done = published(tmp_path, 1, folder)
    sender.offer(1, folder, done.manifest_data)
    receive(sender.address, 1, done.manifest_sha256)
    settled = sender._store.num_keys()

    for _ in range(3):
        receive(sender.address, 1, done.manifest_sha256)
    with pytest.raises(TransferError, match="refused"):
        receive(sender.address, 2, done.manifest_sha256)
    deadline = time.monotonic() + 5  # the sender deletes its group's keys once its last send returns
    while sender._store.num_keys() > settled and time.monotonic() < deadline:
        time.sleep(0.05)

    assert sender._store.num_keys() == settled
