"""Event-log throughput, and the codec: rollwire's backends next to raw confluent-kafka.

    python bench/bus.py [--small N] [--large N]

For 1 KB and 64 KB rollout events (encoded once, the same bytes everywhere) it produces N events
then consumes them, through
  - raw confluent-kafka (the baseline: same client settings, no rollwire code),
  - rollwire's Kafka log,
  - rollwire's embedded log,
and prints events/s and MB/s with each one's ratio to the raw baseline measured in this run.
Then msgpack (rollwire's codec) against JSON encode/decode of a realistic rollout event.
Uses the broker at $KAFKA_BOOTSTRAP_SERVERS, or starts a local one (deploy/kafka/broker.py).
The last line is `RESULT name=value ...`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def rollout_event(target_bytes: int):
    from rollwire.schemas import RolloutCompleted, WeightVersionSpan
    n = max(4, (target_bytes - 450) // 12)  # ~12 encoded bytes per completion token
    return RolloutCompleted(
        group_id=uuid.uuid4().hex, task_id="gsm8k-00042", environment="gsm8k", algorithm="grpo",
        group_size=8, sample_index=3, prompt_token_ids=list(range(100, 160)),
        completion_token_ids=[(i * 7919) % 150_000 for i in range(n)],
        completion_logprobs=[-0.25 - (i % 13) * 0.1 for i in range(n)], loss_mask=[1] * n,
        weight_versions=[WeightVersionSpan(version=41, start=0, end=n)],
        rewards={"correct": 1.0, "format": 0.5}, reward=1.25, metrics={"num_turns": 1.0})


def start_broker():
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        return external, None
    spec = importlib.util.spec_from_file_location("local_broker", REPO / "deploy/kafka/broker.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    info = module.start(Path(tempfile.mkdtemp(prefix="bench-kafka-")))
    return info.bootstrap, lambda: module.stop(info)


def raw_kafka(bootstrap: str, topic: str, payloads: list[tuple[bytes, bytes]]) -> tuple[float, float]:
    import confluent_kafka
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                         "partitioner": "murmur2_random", "linger.ms": 5,
                                         "compression.type": "lz4", "message.max.bytes": 64 * 1024 * 1024,
                                         "logger": logging.getLogger("bench.raw")})
    producer.list_topics(topic, timeout=10)  # connected and topic metadata known, as rollwire's send does
    t0 = time.perf_counter()
    for key, value in payloads:
        while True:
            try:
                producer.produce(topic, value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)
    produce_s = time.perf_counter() - t0
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                         "isolation.level": "read_committed",
                                         "logger": logging.getLogger("bench.raw")})
    consumer.list_topics(topic, timeout=10)
    consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                     for p in range(4)])
    got, t0 = 0, time.perf_counter()
    while got < len(payloads):
        batch = consumer.consume(min(1000, len(payloads) - got), timeout=1.0)
        got += sum(1 for m in batch if m.error() is None)
    consume_s = time.perf_counter() - t0
    consumer.close()
    return produce_s, consume_s


def through_log(log, topic: str, payloads: list[tuple[bytes, bytes]]) -> tuple[float, float]:
    from rollwire.core.bus import Beginning
    with log.producer() as producer:
        t0 = time.perf_counter()
        for key, value in payloads:
            producer.send(topic, value, key=key)
        producer.flush(120)
        produce_s = time.perf_counter() - t0
    with log.reader([topic], Beginning()) as reader:  # connected, metadata known: as the baseline
        got, t0 = 0, time.perf_counter()
        while got < len(payloads):
            got += len(reader.poll_batch(1000, 1.0))
        return produce_s, time.perf_counter() - t0


def codec_rates(event, repeats: int) -> dict[str, float]:
    from rollwire.schemas import Codec, RolloutCompleted
    codec = Codec()
    t0 = time.perf_counter()
    for _ in range(repeats):
        packed = codec.encode(event, producer="bench")
    msgpack_encode = repeats / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        codec.decode(packed)
    msgpack_decode = repeats / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        text = json.dumps({"type": event.type, "payload": event.model_dump(mode="json")}).encode()
    json_encode = repeats / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        RolloutCompleted.model_validate(json.loads(text)["payload"])
    json_decode = repeats / (time.perf_counter() - t0)
    return {"msgpack_encode": msgpack_encode, "msgpack_decode": msgpack_decode, "json_encode": json_encode,
            "json_decode": json_decode, "msgpack_bytes": len(packed), "json_bytes": len(text)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=20_000, help="1 KB events per backend (default %(default)s)")
    parser.add_argument("--large", type=int, default=1_000, help="64 KB events per backend (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best counts")
    args = parser.parse_args()

    from rollwire.core.bus import TopicConfig
    from rollwire.core.bus.embedded import EmbeddedLog
    from rollwire.core.bus.kafka import KafkaLog
    from rollwire.schemas import Codec

    bootstrap, stop_broker = start_broker()
    results: dict[str, float] = {}
    try:
        kafka = KafkaLog(bootstrap)
        embedded = EmbeddedLog(tempfile.mkdtemp(prefix="bench-embedded-"))
        warmup = f"bench-warmup-{uuid.uuid4().hex[:8]}"  # broker, producer ids, page cache
        kafka.create_topics([TopicConfig(warmup, partitions=4)])
        raw_kafka(bootstrap, warmup, [(b"k%d" % i, b"x" * 1024) for i in range(2000)])
        print(f"{'size':>6} {'backend':<10} {'produce ev/s':>13} {'MB/s':>7} {'consume ev/s':>13} {'MB/s':>7}"
              f" {'vs raw (p/c)':>13}")
        for label, size, count in (("1KB", 1024, args.small), ("64KB", 64 * 1024, args.large)):
            value = Codec(max_event_bytes=1 << 20).encode(rollout_event(size), producer="bench")
            payloads = [(f"group-{i % 256}".encode(), value) for i in range(count)]
            mb = len(value) * count / 1e6
            rows = {}
            for backend in ("raw", "kafka", "embedded"):
                log = embedded if backend == "embedded" else kafka
                timings = []
                for _ in range(args.repeats):
                    topic = f"bench-{backend}-{uuid.uuid4().hex[:8]}"
                    log.create_topics([TopicConfig(topic, partitions=4, max_message_bytes=8 * 1024 * 1024)])
                    timings.append(raw_kafka(bootstrap, topic, payloads) if backend == "raw" else
                                   through_log(log, topic, payloads))
                p_s, c_s = min(t[0] for t in timings), min(t[1] for t in timings)
                rows[backend] = (count / p_s, count / c_s)
                raw_p, raw_c = rows["raw"]
                print(f"{label:>6} {backend:<10} {count / p_s:13,.0f} {mb / p_s:7.1f} {count / c_s:13,.0f}"
                      f" {mb / c_s:7.1f} {count / p_s / raw_p:6.2f}/{count / c_s / raw_c:<6.2f}")
                results[f"{backend}_{label}_produce_eps"] = count / p_s
                results[f"{backend}_{label}_consume_eps"] = count / c_s
            for backend in ("kafka", "embedded"):
                results[f"{backend}_{label}_produce_vs_raw"] = rows[backend][0] / rows["raw"][0]
                results[f"{backend}_{label}_consume_vs_raw"] = rows[backend][1] / rows["raw"][1]
        kafka.close()
    finally:
        if stop_broker:
            stop_broker()

    rates = codec_rates(rollout_event(1024), 5000)
    print(f"\ncodec, ~1 KB rollout event: msgpack {rates['msgpack_bytes']} B, JSON {rates['json_bytes']} B")
    for op in ("encode", "decode"):
        m, j = rates[f"msgpack_{op}"], rates[f"json_{op}"]
        print(f"  {op}: msgpack {m:,.0f}/s  JSON {j:,.0f}/s  msgpack/JSON {m / j:.2f}x")
        results[f"codec_{op}_msgpack_vs_json"] = m / j
    results["codec_size_msgpack_vs_json"] = rates["msgpack_bytes"] / rates["json_bytes"]
    print("RESULT " + " ".join(f"{k}={v:.3g}" for k, v in results.items()))


if __name__ == "__main__":
    main()
