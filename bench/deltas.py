"""Bytes and time of weight versions stored as deltas, next to the same versions whole.

    python bench/deltas.py [--model DIR] [--lrs 1e-6 1e-5 1e-4] [--steps 3] [--store local|s3]

Trains the model in bfloat16 (the published dtype: `[trainer.model] dtype = "bfloat16"`) with
AdamW on fixed token ids, `--steps` steps per learning rate from the same start, and publishes
every version as the trainer does: a snapshot, then each version a delta on the one before
(`rollwire.core.weight_versions.publish` with a base) into a local store, or with `--store s3`
into an S3 endpoint (moto's server on loopback). Per learning rate: the
share of elements whose bits changed, delta bytes over whole bytes, the trainer's publish time
(save excluded) and a replica's fetch time (with the previous version as its base), each against
the same version published and fetched whole, in the same run. Every rebuilt file is compared
with the trainer's byte for byte. Default model: SmolLM2-135M where `python deploy/models/fetch.py
smollm2 --import` put it, else a tiny Llama built here. The last line is `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = REPO / ".cache/models/smollm2"


def train_versions(model_dir: Path, lr: float, steps: int, out: Path) -> list[Path]:
    """`steps` + 1 folders: the start, then the weights after each AdamW step, saved in bfloat16."""
    import torch
    from transformers import AutoModelForCausalLM

    from rollwire.trainer.model import save_model
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    ids = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))
    folders = []
    for step in range(steps + 1):
        if step:
            loss = model(input_ids=ids, labels=ids).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        folders.append(out / f"v{step + 1}")
        save_model(model, folders[-1])
    return folders


def measure(folders: list[Path], work: Path, s3: str | None = None) -> dict[str, list[float]]:
    """Publishes `folders` whole and as deltas into two stores (local directories, or two buckets on
    the S3 endpoint `s3`); fetches each both ways."""
    import uuid

    from rollwire.core.objectstore import LocalStore, S3Store
    from rollwire.core.weight_versions import DeltaBase, fetch, publish
    if s3 is None:
        whole_store, delta_store = LocalStore(work / "whole"), LocalStore(work / "delta")
    else:
        whole_store, delta_store = (S3Store(s3, f"{kind}-{uuid.uuid4().hex[:8]}", access_key="k", secret_key="s",
                                            secure=False, region="us-east-1") for kind in ("whole", "delta"))
    rows: dict[str, list[float]] = {k: [] for k in ("changed", "bytes", "publish_delta", "publish_whole",
                                                       "fetch_delta", "fetch_whole")}
    base = None
    for version, folder in enumerate(folders, start=1):
        started = time.perf_counter()
        whole = publish(whole_store, folder, f"p/v{version:08d}", policy="p", version=version, step=version)
        publish_whole = time.perf_counter() - started
        started = time.perf_counter()
        delta = publish(delta_store, folder, f"p/v{version:08d}", policy="p", version=version, step=version, base=base)
        publish_delta = time.perf_counter() - started
        if base is not None:
            assert delta.encoding == "delta", f"version {version} was stored whole"
            started = time.perf_counter()
            fetch(whole_store, whole.uri, whole.manifest_sha256, work / f"whole-v{version}")
            fetch_whole = time.perf_counter() - started
            started = time.perf_counter()
            fetch(delta_store, delta.uri, delta.manifest_sha256, work / f"delta-v{version}",
                  has={base.manifest_sha256: work / f"delta-v{version - 1}"})
            fetch_delta = time.perf_counter() - started
            for name in ("model.safetensors",):
                assert (work / f"delta-v{version}" / name).read_bytes() == (folder / name).read_bytes(), \
                    f"version {version} was not rebuilt bit for bit"
            for key, value in (("changed", delta.changed_share), ("bytes", delta.size_bytes / delta.full_size_bytes),
                               ("publish_delta", publish_delta), ("publish_whole", publish_whole),
                               ("fetch_delta", fetch_delta), ("fetch_whole", fetch_whole)):
                rows[key].append(float(value or 0.0))
        else:
            shutil.copytree(folder, work / f"delta-v{version}")  # the replica's first version, whole
        base = DeltaBase(version, delta.uri, delta.manifest_sha256, folder, delta.manifest.result or delta.manifest.files)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="a Hugging Face model folder (default: SmolLM2-135M if imported, else a tiny Llama)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5, 1e-4])
    parser.add_argument("--steps", type=int, default=3, help="AdamW steps (delta versions) per learning rate")
    parser.add_argument("--store", choices=["local", "s3"], default="local",
                        help="local: directories on this disk; s3: an S3 endpoint (moto's server on loopback)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    s3, moto = None, None
    if args.store == "s3":
        import logging

        from moto.server import ThreadedMotoServer
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        s3 = "{}:{}".format(*moto.get_host_and_port())
    try:
        return run(args, s3)
    finally:
        if moto is not None:
            moto.stop()


def run(args: argparse.Namespace, s3: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="rollwire-deltas-") as scratch:
        work = Path(scratch)
        model = args.model
        if model is None and SMOLLM2.exists():
            model = SMOLLM2
        if model is None:
            from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model
            model = build_tiny_model(work / "tiny", build_char_tokenizer(), seed=0, hidden=256, layers=4,
                                     intermediate=1024)
        print(f"model {model}; bfloat16, AdamW, {args.steps} steps per learning rate; store: {args.store}", flush=True)
        summary = {}
        for lr in args.lrs:
            folders = train_versions(model, lr, args.steps, work / f"lr{lr:g}" / "trainer")
            rows = measure(folders, work / f"lr{lr:g}", s3)
            med = {k: statistics.median(v) for k, v in rows.items()}
            full_mb = sum(f.stat().st_size for f in folders[0].glob("*.safetensors")) / 1e6
            print(f"lr {lr:g}: {100 * med['changed']:.2f}% of elements changed; delta {100 * med['bytes']:.2f}% of "
                  f"the whole {full_mb:.0f} MB; publish {med['publish_delta']:.2f} s vs whole "
                  f"{med['publish_whole']:.2f} s ({med['publish_delta'] / med['publish_whole']:.2f}x); replica fetch "
                  f"{med['fetch_delta']:.2f} s vs whole {med['fetch_whole']:.2f} s "
                  f"({med['fetch_delta'] / med['fetch_whole']:.2f}x); every rebuild bit-identical", flush=True)
            summary[f"{lr:g}"] = med
            shutil.rmtree(work / f"lr{lr:g}")
    print("RESULT " + " ".join(f"delta_share_lr{lr}={m['bytes']:.4f} changed_lr{lr}={m['changed']:.4f} "
                               f"fetch_ratio_lr{lr}={m['fetch_delta'] / m['fetch_whole']:.3f}"
                               for lr, m in summary.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
