"""Weight deltas rebuild the new file bit for bit, and refuse what they cannot rebuild."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from rollwire.core import weight_deltas
from rollwire.core.weight_deltas import DeltaError


def save(path, tensors):
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def versions(tmp_path):
    """Two versions of a mixed-dtype file: a few bfloat16 elements moved, one float32 tensor wholly,
    a float16 one untouched; NaN, -0.0 and +inf among the changes."""
    torch.manual_seed(0)
    old = {"embed.weight": torch.randn(300, 64).to(torch.bfloat16), "norm.weight": torch.randn(64),
           "head.weight": torch.randn(64, 300).to(torch.float16)}
    new = {k: v.clone() for k, v in old.items()}
    flat = new["embed.weight"].view(-1)
    flat[[0, 5, 6, 1000, 19199]] = torch.tensor([float("nan"), -0.0, float("inf"), 1.5, -2.0], dtype=torch.bfloat16)
    new["norm.weight"] += 1.0
    return save(tmp_path / "old.safetensors", old), save(tmp_path / "new.safetensors", new)


def test_a_delta_rebuilds_the_new_file_bit_for_bit(versions, tmp_path):
    old, new = versions
    stats = weight_deltas.encode(old, new, tmp_path / "d.delta")
    assert stats is not None and stats.changed == 5 + 64 and stats.elements == 300 * 64 * 2 + 64
    assert stats.delta_bytes < 0.05 * stats.full_bytes
    weight_deltas.apply(old, tmp_path / "d.delta", tmp_path / "rebuilt.safetensors")
    assert (tmp_path / "rebuilt.safetensors").read_bytes() == new.read_bytes()


def test_a_delta_refuses_another_base_and_bytes_that_are_not_a_delta(versions, tmp_path):
    old, new = versions
    weight_deltas.encode(old, new, tmp_path / "d.delta")
    with pytest.raises(DeltaError, match="another version"):
        weight_deltas.apply(new, tmp_path / "d.delta", tmp_path / "x")
    (tmp_path / "junk.delta").write_bytes(b"not a delta")
    with pytest.raises(DeltaError, match="not a weight delta"):
        weight_deltas.apply(old, tmp_path / "junk.delta", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_no_delta_where_the_layout_changed_or_most_elements_moved(tmp_path):
    a = save(tmp_path / "a.safetensors", {"w": torch.zeros(8, 8)})
    b = save(tmp_path / "b.safetensors", {"w": torch.zeros(8, 9)})
    c = save(tmp_path / "c.safetensors", {"w": torch.ones(8, 8)})
    assert weight_deltas.encode(a, b, tmp_path / "ab.delta") is None
    assert weight_deltas.encode(a, c, tmp_path / "ac.delta") is None
    assert not (tmp_path / "ab.delta").exists() and not (tmp_path / "ac.delta").exists()


def test_float32_training_is_given_up_on_a_sample_and_a_mostly_moved_file_part_way(tmp_path, monkeypatch):
    """Past the sample's threshold no change list is built; between the two thresholds the
    comparison stops at the tensor where the changes pass half the file."""
    torch.manual_seed(0)
    old = {"a": torch.randn(1000), "b": torch.randn(1000), "c": torch.randn(1000)}
    base = save(tmp_path / "old.safetensors", old)
    moved = save(tmp_path / "moved.safetensors", {k: v + 1 for k, v in old.items()})
    most = save(tmp_path / "most.safetensors", {"a": old["a"] + 1, "b": old["b"] + 1, "c": old["c"]})
    compared = []
    flatnonzero = np.flatnonzero
    monkeypatch.setattr(weight_deltas.np, "flatnonzero", lambda a: compared.append(a.size) or flatnonzero(a))
    assert weight_deltas.encode(base, moved, tmp_path / "moved.delta") is None and compared == []
    assert weight_deltas.encode(base, most, tmp_path / "most.delta") is None and compared == [1000, 1000]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), max_size=50))
def test_change_lists_round_trip(values):
    data = np.array(values, dtype=np.uint64)
    assert weight_deltas._read_varints(weight_deltas._varints(data)).tolist() == values
