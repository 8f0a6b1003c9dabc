"""A dedupe window's memory over a long run: `RecentKeys` against a set beside a deque, the obvious way,
and a dict beside an OrderedDict (how the scorer holds its closed groups, ids as strings).

    python bench/dedupe_memory.py [--window 200000] [--keys 3000000]

Each arm runs in its own interpreter. It adds `--keys` keys (a group id and a sample index, as the
dispatcher's) to a window of `--window` keys, with the churn of a component that decodes events beside
it: a buffer of 0.6-16 KB allocated per key, the last 2,000 kept. Every 100,000 keys it reads the
process's RSS and the resident size of its heap (`[heap]` in /proc/self/smaps: what malloc took with
brk, where the allocator keeps freed blocks it may reuse). Per arm:

- held: RSS once the window is full, less RSS before the first key (the churn's buffers held already);
- after full: RSS at the end less RSS when the window first filled (a bounded window should hold flat:
  at the dispatcher's ~7,500 keys a minute, 3,000,000 keys are ~6.5 hours);
- heap MB at those two points, and µs per key added (the churn included, the same in every arm);
- alone: µs per key added to a fresh window with nothing beside it (three windows' worth of keys);
- trimmed: what "after full" is once glibc's `malloc_trim(0)` has given back the free pages it held: the
  growth that is live memory, not the allocator's.

Any Python map that forgets as fast as it learns allocates its table again from time to time (deleted
slots are reclaimed only by a resize); the third arm shows what that costs where it cannot be avoided.
The baseline for the bytes is the digests themselves (8 B a key, the least a window of 64-bit digests can
hold); for the time, the set's, whose every step is C.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class SetAndQueue:
    """A window as a set of digests beside a deque of their order (how `RecentKeys` held them before)."""

    def __init__(self, limit: int) -> None:
        from rollwire.core.bounds import digest

        self.limit, self._held, self._order, self._digest = limit, set(), collections.deque(), digest

    def add(self, key: tuple[str, int]) -> bool:
        d = self._digest(key)
        if d in self._held:
            return False
        self._held.add(d)
        self._order.append(d)
        if len(self._order) > self.limit:
            self._held.discard(self._order.popleft())
        return True


class MapAndOrder:
    """A window as the scorer holds closed groups: a dict by id beside an OrderedDict of their order."""

    def __init__(self, limit: int) -> None:
        self.limit, self._held, self._order = limit, {}, collections.OrderedDict()

    def add(self, key: tuple[str, int]) -> bool:
        name = f"{key[0]}/{key[1]}"
        if name in self._held:
            return False
        self._held[name] = self._order[name] = None
        if len(self._order) > self.limit:
            del self._held[self._order.popitem(last=False)[0]]
        return True


def resident() -> tuple[float, float]:
    """RSS and the heap's resident MB of this process."""
    rss = heap = 0
    region = ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                region = fields[5] if len(fields) > 5 else ""
            elif fields[0] == "Rss:":
                rss += int(fields[1])
                heap += int(fields[1]) if region == "[heap]" else 0
    return rss / 1024, heap / 1024


def arm(kind: str, window: int, keys: int) -> dict[str, float]:
    """One arm, in this process."""
    import logging

    from rollwire.core.bounds import RecentKeys

    logging.disable(logging.WARNING)  # "dispatcher.started is full" is expected here
    rng = random.Random(1)
    churn = collections.deque((bytes(rng.randint(600, 16_000)) for _ in range(2000)), maxlen=2000)
    start_rss, _ = resident()  # the churn's own buffers already held
    held = RecentKeys(window, "bench.window") if kind == "RecentKeys" else {
        "set + deque": SetAndQueue, "dict + OrderedDict": MapAndOrder}[kind](window)
    full = None
    began = time.perf_counter()
    for n in range(1, keys + 1):
        held.add((f"g-{n // 8}", n % 8))
        churn.append(bytes(rng.randint(600, 16_000)))
        if n == window:
            full = resident()
    seconds = time.perf_counter() - began
    end = resident()
    assert full is not None, "--keys must be more than --window"
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc gives back the free pages it holds, wherever they are
    trimmed = resident()
    alone = RecentKeys(window, "bench.alone") if kind == "RecentKeys" else type(held)(window)
    timed = [(f"a-{n // 8}", n % 8) for n in range(3 * window)]
    began = time.perf_counter()
    for key in timed:
        alone.add(key)
    alone_us = 1e6 * (time.perf_counter() - began) / len(timed)
    return {"alone_us": alone_us, "held_mb": full[0] - start_rss, "after_full_mb": end[0] - full[0], "heap_full": full[1],
            "heap_end": end[1], "after_trim_mb": trimmed[0] - full[0], "us_per_key": 1e6 * seconds / keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=200_000, help="keys the window remembers")
    parser.add_argument("--keys", type=int, default=3_000_000, help="keys added in all")
    parser.add_argument("--arm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(arm(args.arm, args.window, args.keys)))
        return
    results = {}
    for kind in ("set + deque", "dict + OrderedDict", "RecentKeys"):
        out = subprocess.run([sys.executable, __file__, "--arm", kind, "--window", str(args.window),
                              "--keys", str(args.keys)], check=True, capture_output=True, text=True, cwd=ROOT)
        results[kind] = json.loads(out.stdout.splitlines()[-1])
    print(f"a window of {args.window} keys, {args.keys} added, 0.6-16 KB of churn per key")
    print(f"{'arm':<18} {'held MB':>8} {'B/key':>6} {'after full MB':>14} {'heap MB full -> end':>20} "
          f"{'trimmed':>8} {'us/key':>7} {'alone':>6}")
    for kind, r in results.items():
        print(f"{kind:<18} {r['held_mb']:8.1f} {2**20 * r['held_mb'] / args.window:6.0f} {r['after_full_mb']:14.1f} "
              f"{r['heap_full']:9.0f} -> {r['heap_end']:<8.0f} {r['after_trim_mb']:8.1f} {r['us_per_key']:7.1f} "
              f"{r['alone_us']:6.2f}")
    ours, theirs = results["RecentKeys"], results["set + deque"]
    per_key = 2**20 * ours["held_mb"] / args.window
    time_ratio = ours["alone_us"] / theirs["alone_us"]
    print(f"RecentKeys holds {per_key / 8:.1f}x the digests' own 8 B a key; it grew {ours['after_full_mb']:.1f} MB "
          f"once full against {theirs['after_full_mb']:.1f} MB; time per key {time_ratio:.2f}x the set's")
    print(f"RESULT bytes_per_key={per_key:.0f} after_full_mb={ours['after_full_mb']:.1f} "
          f"set_after_full_mb={theirs['after_full_mb']:.1f} time_vs_set={time_ratio:.2f}")


if __name__ == "__main__":
    main()
