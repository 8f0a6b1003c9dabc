"""Weight deltas: one version as the elements that changed since another, applied bit for bit.

At fine-tuning learning rates most elements of a bfloat16 tensor keep their value from one
version to the next (an update smaller than half a unit in the last place rounds away). A delta
stores, per tensor, where the bits changed and the new bits — never a difference to add, so the
result is the new version exactly, whatever the dtype:

    <file>.safetensors.delta   zlib(msgpack({"format", "base_sha256", "tensors": [
                                   {"name", "index": varint gaps between changed elements,
                                    "values": their new bytes}              sparse
                                   {"name", "values": the whole tensor's bytes}]}))   dense

    encode(base_file, new_file, out)   None when the two files' headers differ, or over half the
                                       elements changed (float32 training): a snapshot is due
    apply(base_file, delta_file, out)  the new file; the caller checks its sha256 against the
                                       manifest's result (`rollwire.core.weight_versions.fetch`)

A tensor is stored dense where that is smaller. Only safetensors files are delta-encoded; the
other files of a version (config, tokenizer) are small and travel whole. numpy does the element
work; torch is not needed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import msgpack
import numpy as np

from rollwire.core.errors import RollwireError

DELTA_SUFFIX = ".delta"
FORMAT = "rollwire-delta/1"
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
              "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
MAX_CHANGED_SHARE = 0.5
"""Past this share of changed elements a delta (index and value per element) is no smaller than the file."""
SAMPLE_ELEMENTS = 1 << 20
SAMPLED_GIVE_UP_SHARE = 0.75
"""A sample of `SAMPLE_ELEMENTS` this far past `MAX_CHANGED_SHARE` ends the attempt before the full comparison."""
_ZLIB_LEVEL = 1  # the sign-and-exponent bytes of the new values compress; a higher level buys little for its time


class DeltaError(RollwireError):
    """A delta does not apply: its base is another file, or its bytes are not a delta."""


@dataclass(frozen=True)
class DeltaStats:
    """What one file's delta holds."""

    elements: int
    """Elements of every tensor in the file."""
    changed: int
    """Elements whose bits changed."""
    delta_bytes: int
    """Size of the encoded delta."""
    full_bytes: int
    """Size of the new file."""


def _layout(data: bytes | memoryview, name: str) -> tuple[int, dict]:
    """(offset of the data buffer, the header's tensors) of safetensors bytes."""
    if len(data) < 8:
        raise DeltaError(f"{name} is too short to be a safetensors file")
    (length,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(bytes(data[8:8 + length]))
    except ValueError as exc:
        raise DeltaError(f"{name} has an unreadable safetensors header") from exc
    header.pop("__metadata__", None)
    return 8 + length, header


def _elements(buffer: np.ndarray, start: int, info: dict) -> np.ndarray:
    """A tensor's elements as unsigned integers of its item size (its bits, compared exactly)."""
    size = ITEM_BYTES.get(info["dtype"])
    if size is None:
        raise DeltaError(f"dtype {info['dtype']} has no known item size")
    begin, end = info["data_offsets"]
    return buffer[start + begin:start + end].view(_UINT[size])


def encode(base_file: Path, new_file: Path, out: Path, *, base_sha256: str | None = None) -> DeltaStats | None:
    """Writes the delta from `base_file` to `new_file` at `out`; None (nothing written) when their
    headers differ, so that no delta can express the change, or when so many elements changed
    that the whole file is as small."""
    base, new = np.memmap(base_file, dtype=np.uint8, mode="r"), np.memmap(new_file, dtype=np.uint8, mode="r")
    start, header = _layout(new.data, new_file.name)
    base_start, base_header = _layout(base.data, base_file.name)
    if start != base_start or bytes(base[:start]) != bytes(new[:start]) or len(base) != len(new):
        return None
    tensors_in_order = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
    elements = sum(_elements(new, start, info).size for _, info in tensors_in_order)
    # float32 training moves nearly every element each step: a strided sample says so at once,
    # before any change list is built (those would take 8 bytes an element)
    if _sampled_changed_share(base, new, start, tensors_in_order) > SAMPLED_GIVE_UP_SHARE:
        return None
    changes, changed = [], 0
    for name, info in tensors_in_order:
        old_bits, new_bits = _elements(base, start, info), _elements(new, start, info)
        index = np.flatnonzero(old_bits != new_bits)
        changed += index.size
        if changed > MAX_CHANGED_SHARE * elements:
            return None
        changes.append((name, new_bits, index))
    tensors = []
    for name, new_bits, index in changes:
        if index.size == 0:
            continue
        gaps = _varints(np.diff(index, prepend=-1) - 1)
        values = new_bits[index].tobytes()
        if len(gaps) + len(values) < new_bits.nbytes:
            tensors.append({"name": name, "index": gaps, "values": values})
        else:
            tensors.append({"name": name, "values": new_bits.tobytes()})
    digest = base_sha256 or hashlib.sha256(base.data).hexdigest()
    payload = msgpack.packb({"format": FORMAT, "base_sha256": digest, "base_bytes": len(base), "tensors": tensors},
                           use_bin_type=True)
    data = zlib.compress(payload, _ZLIB_LEVEL)
    out.write_bytes(data)
    return DeltaStats(elements=elements, changed=changed, delta_bytes=len(data), full_bytes=len(new))


def _sampled_changed_share(base: np.ndarray, new: np.ndarray, start: int, tensors: list[tuple[str, dict]]) -> float:
    """The share of changed elements over about `SAMPLE_ELEMENTS` of them, evenly strided through
    every tensor."""
    total = sum(_elements(new, start, info).size for _, info in tensors)
    stride = max(1, total // SAMPLE_ELEMENTS)
    sampled = changed = 0
    for _, info in tensors:
        old_bits, new_bits = _elements(base, start, info)[::stride], _elements(new, start, info)[::stride]
        sampled, changed = sampled + new_bits.size, changed + int(np.count_nonzero(old_bits != new_bits))
    return changed / max(sampled, 1)


def apply(base_file: Path, delta_file: Path, out: Path, *, check_base: bool = True) -> None:
    """Writes `base_file` with the delta at `delta_file` applied to `out`: a copy of the base,
    patched in place. `check_base=False` skips hashing the base, for a caller that checks the
    result's digest anyway (`rollwire.core.weight_versions`): a wrong base then shows there."""
    try:
        delta = msgpack.unpackb(zlib.decompress(delta_file.read_bytes()), raw=False)
    except (zlib.error, ValueError, msgpack.UnpackException) as exc:
        raise DeltaError(f"{delta_file.name} is not a weight delta: {exc}") from exc
    if not isinstance(delta, dict) or delta.get("format") != FORMAT:
        raise DeltaError(f"{delta_file.name} is not a {FORMAT} delta")
    if base_file.stat().st_size != delta.get("base_bytes", base_file.stat().st_size) or (
            check_base and sha256_of(base_file) != delta["base_sha256"]):
        raise DeltaError(f"{delta_file.name} applies to another version of {base_file.name} than the one here")
    shutil.copyfile(base_file, out)
    buffer = np.memmap(out, dtype=np.uint8, mode="r+")
    start, header = _layout(buffer.data, base_file.name)
    for tensor in delta["tensors"]:
        info = header.get(tensor["name"])
        if info is None:
            raise DeltaError(f"{delta_file.name} changes {tensor['name']!r}, which {base_file.name} does not hold")
        bits = _elements(buffer, start, info)
        values = np.frombuffer(tensor["values"], dtype=bits.dtype)
        if "index" not in tensor:
            if values.size != bits.size:
                raise DeltaError(f"{delta_file.name} gives {values.size} elements for {tensor['name']!r} of {bits.size}")
            bits[:] = values
            continue
        index = np.cumsum(_read_varints(tensor["index"]) + 1) - 1
        if index.size != values.size or (index.size and index[-1] >= bits.size):
            raise DeltaError(f"{delta_file.name} has a malformed change list for {tensor['name']!r}")
        bits[index] = values
    buffer.flush()
    del buffer


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _varints(values: np.ndarray) -> bytes:
    """Unsigned LEB128 (7 bits a byte, high bit: more follow), all values at once."""
    values = values.astype(np.uint64)
    lengths = np.ones(values.size, dtype=np.int64)
    for k in range(1, 10):
        lengths += values >= np.uint64(1 << (7 * k))
    out = np.zeros(int(lengths.sum()), dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    for k in range(int(lengths.max(initial=0))):
        has = lengths > k
        group = (values[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (lengths[has] > k + 1).astype(np.uint64) << np.uint64(7)
        out[starts[has] + k] = (group | more).astype(np.uint8)
    return out.tobytes()


def _read_varints(data: bytes) -> np.ndarray:
    raw = np.frombuffer(data, dtype=np.uint8)
    if raw.size == 0:
        return np.zeros(0, dtype=np.int64)
    if raw[-1] & 0x80:
        raise DeltaError("a change list ends inside a number")
    last = (raw & 0x80) == 0
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    owner = np.repeat(np.arange(ends.size), ends - starts + 1)
    place = np.arange(raw.size) - starts[owner]
    values = np.zeros(ends.size, dtype=np.uint64)
    for k in range(int(place.max()) + 1):
        at = place == k
        values[owner[at]] |= (raw[at] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values.astype(np.int64)
