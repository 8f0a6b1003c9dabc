"""The trainer's own checkpoint: model, optimizer, read positions, version and the step's outbox,
saved as one unit, so a restart resumes exactly.

    <checkpoint_dir>/step-00000012/
        model/            save_pretrained (safetensors), or the adapter for LoRA
        optimizer.pt      optimizer state
        rng.pt            torch's CPU random state (and CUDA's where present)
        state.json        step, version, read positions, recent rollout ids (digests), outbox
    <checkpoint_dir>/step-00000012-drops-00000013/
                          the same model and optimizer (hard links), later read positions, and
                          an outbox of drops only: rollouts dropped while no batch formed
    <checkpoint_dir>/published/v00000012/
                          the last weight version this process published, whole: the next
                          version's delta base (`rollwire.trainer.loop`; emptied at start)

It is written to `….partial` and renamed: a directory without that suffix is always complete.
The outbox holds the events of the commit (train step, weights, drops); they are sent after the
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

from rollwire.core.bounds import digest, pack, unpack
from rollwire.trainer.model import save_model


@dataclass
class TrainerState:
    step: int = 0
    version: int = 0
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    seen: list[int] = field(default_factory=list)
    """Digests of the rollout ids read lately and accounted for (`core.bounds.digest`), oldest first."""
    outbox: list[dict] = field(default_factory=list)
    """Events to send for this commit: `{"topic", "key", "event"}` with the event as JSON data."""
    commits: int = 0
    """Checkpoints written so far, steps and drops-only commits together."""

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "version": self.version,
                           "positions": [[t, p, o] for (t, p), o in sorted(self.positions.items())],
                           "seen_digests": pack(self.seen), "outbox": self.outbox, "commits": self.commits})

    @classmethod
    def from_json(cls, text: str) -> TrainerState:
        raw = json.loads(text)
        # checkpoints from before digests hold the ids themselves
        seen = unpack(raw["seen_digests"]) if "seen_digests" in raw else [digest(rid) for rid in raw["seen"]]
        return cls(step=raw["step"], version=raw["version"],
                   positions={(t, p): o for t, p, o in raw["positions"]}, seen=seen, outbox=raw["outbox"],
                   commits=raw.get("commits", raw["step"]))


def save(folder: Path, model, optimizer, state: TrainerState, keep: int = 2, keep_every: int = 0) -> Path:
    """Writes the checkpoint of step `state.step` atomically; keeps the newest `keep`, and those of
    every `keep_every`-th step."""
    state.commits += 1
    def weights(partial: Path) -> None:
        save_model(model, partial / "model")
        torch.save(optimizer.state_dict(), partial / "optimizer.pt")
        _save_rng(partial)

    return _commit(folder, f"step-{state.step:08d}", state, keep, weights, keep_every)


def _save_rng(folder: Path) -> None:
    rng: dict[str, object] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, folder / "rng.pt")


def restore(settings, path: Path | None):
    """`(state, model, optimizer)` as checkpoint `path` left them, or as a trainer starts with
    `settings` (`TrainerSettings`) when `path` is None: the one way the trainer, and a replay
    from a checkpoint, come to the same starting point."""
    from rollwire.trainer.model import load_policy
    torch.manual_seed(settings.seed)
    state = load_state(path) if path is not None else TrainerState()
    if path is None or settings.model.lora is not None:
        model = load_policy(settings.model)
        if path is not None:
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file
            set_peft_model_state_dict(model, load_file(path / "model" / "adapter_model.safetensors"))
    else:
        model = load_policy(settings.model, weights=str(path / "model"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.lr,
                                  weight_decay=settings.weight_decay)
    if path is not None:
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        if (path / "rng.pt").exists():  # checkpoints written before it was saved resume from the seed
            rng = torch.load(path / "rng.pt", weights_only=True)
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(rng["cuda"])
    return state, model, optimizer


def at_step(folder: Path, step: int) -> Path:
    """The complete checkpoint left after trainer step `step` (its newest commit: drops-only
    commits after a step hold the same model); `FileNotFoundError` names the steps kept."""
    matches = [p for p in _complete(folder) if load_state(p).step == step]
    if not matches:
        kept = sorted({load_state(p).step for p in _complete(folder)})
        raise FileNotFoundError(f"no checkpoint of step {step} in {folder}: it keeps steps "
                                f"{', '.join(map(str, kept)) or 'none'} (trainer.keep_checkpoints sets how many)")
    return matches[-1]


def save_drops(folder: Path, previous: Path | None, model, optimizer, state: TrainerState, keep: int = 2,
               keep_every: int = 0) -> Path:
    """Writes a drops-only commit: the model and optimizer of `previous` (hard links, or written
    when there is none yet) with `state`'s later read positions and outbox."""
    state.commits += 1

    def weights(partial: Path) -> None:
        if previous is None:
            save_model(model, partial / "model")
            torch.save(optimizer.state_dict(), partial / "optimizer.pt")
            _save_rng(partial)
            return
        links = [previous / "optimizer.pt", *(p for p in (previous / "model").rglob("*") if p.is_file())]
        links += [previous / "rng.pt"] if (previous / "rng.pt").exists() else []
        for source in links:
            target = partial / source.relative_to(previous)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)

    return _commit(folder, f"step-{state.step:08d}-drops-{state.commits:08d}", state, keep, weights, keep_every)


def _commit(folder: Path, name: str, state: TrainerState, keep: int, write_weights, keep_every: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    final, partial = folder / name, folder / f"{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    write_weights(partial)
    (partial / "state.json").write_text(state.to_json())
    _fsync_tree(partial)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    _prune(folder, keep, keep_every)
    return final


def _prune(folder: Path, keep: int, keep_every: int) -> None:
    """Deletes the complete checkpoints older than the newest `keep`, but those kept for good. It
    reads the folder's names and opens only the newest and the ones it deletes: a run that kept a
    checkpoint every few steps for days does not pay, each step, for every one it kept."""
    newer = 0
    for name in reversed(_names(folder)):
        if newer < keep:
            newer += (folder / name / "state.json").exists()
        elif not (keep_every and _kept_for_good(name, keep_every)) and (folder / name / "state.json").exists():
            shutil.rmtree(folder / name, ignore_errors=True)


def _kept_for_good(name: str, keep_every: int) -> bool:
    """A step's own checkpoint (not a drops-only commit) of a step that is a multiple of `keep_every`."""
    step = name.removeprefix("step-")
    return step.isdigit() and int(step) % keep_every == 0


def _names(folder: Path) -> list[str]:
    """The names of the checkpoints in `folder`, finished or not, oldest first (they sort by step, then by commit)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(e.name for e in entries if e.name.startswith("step-") and not e.name.endswith(".partial"))
    except FileNotFoundError:
        return []


def _complete(folder: Path) -> list[Path]:
    """Finished checkpoints, oldest first."""
    return [folder / name for name in _names(folder) if (folder / name / "state.json").exists()]


def mark_sent(path: Path) -> None:
    """Records that the outbox of checkpoint `path` reached the log."""
    (path / "outbox-sent").touch()


def outbox_sent(path: Path) -> bool:
    return (path / "outbox-sent").exists()


def latest(folder: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    for name in reversed(_names(folder)):
        if (folder / name / "state.json").exists():
            return folder / name
    return None


def load_state(path: Path) -> TrainerState:
    return TrainerState.from_json((path / "state.json").read_text())


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
