"""The trainer's own checkpoint: model, optimizer, read positions, version and the step's outbox,
saved as one unit, so a restart resumes exactly.

    <checkpoint_dir>/step-00000012/
        model/            save_pretrained (safetensors), or the adapter for LoRA
        optimizer.pt      optimizer state
        state.json        step, version, read positions, recent rollout ids, outbox

It is written to `step-….partial` and renamed: a directory named `step-N` is always complete.
The outbox holds the events of step N (train step, weights, drops); they are sent after the
rename, then `outbox-sent` is written. A restart that finds no `outbox-sent` sends them again,
which consumers absorb (they dedupe on step and rollout id).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class TrainerState:
    step: int = 0
    version: int = 0
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    outbox: list[dict] = field(default_factory=list)
    """Events to send for this step: `{"topic", "key", "event"}` with the event as JSON data."""

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "version": self.version,
                           "positions": [[t, p, o] for (t, p), o in sorted(self.positions.items())],
                           "seen": self.seen, "outbox": self.outbox})

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        raw = json.loads(text)
        return cls(step=raw["step"], version=raw["version"],
                   positions={(t, p): o for t, p, o in raw["positions"]}, seen=raw["seen"], outbox=raw["outbox"])


def save(folder: Path, model, optimizer, state: TrainerState, keep: int = 2) -> Path:
    """Writes checkpoint `state.step` atomically; keeps the newest `keep`."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"step-{state.step:08d}"
    partial = folder / f"step-{state.step:08d}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    model.save_pretrained(partial / "model", safe_serialization=True)
    torch.save(optimizer.state_dict(), partial / "optimizer.pt")
    (partial / "state.json").write_text(state.to_json())
    _fsync_tree(partial)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    for old in sorted(folder.glob("step-????????"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def mark_sent(path: Path) -> None:
    """Records that the outbox of checkpoint `path` reached the log."""
    (path / "outbox-sent").touch()


def outbox_sent(path: Path) -> bool:
    return (path / "outbox-sent").exists()


def latest(folder: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    done = sorted(p for p in folder.glob("step-????????") if (p / "state.json").exists()) if folder.exists() else []
    return done[-1] if done else None


def load_state(path: Path) -> TrainerState:
    return TrainerState.from_json((path / "state.json").read_text())


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
