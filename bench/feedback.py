"""Feedback items acknowledged per second through the HTTP API, against the raw producer writing the
same events, on Kafka (and the embedded log with --bus embedded).

    python bench/feedback.py [--items N] [--concurrency C] [--batch B] [--bus kafka|embedded]

The API runs as `rollwire feedback serve` in its own process; clients post from this one with
aiohttp's client (httpx, measured first, capped the rate at ~550 requests/s on its own): single
items at `--concurrency` requests at once (an app posting as users click), then
batches of `--batch` items. Each item is acknowledged only once the log holds it. The baseline is
the limit: the same `feedback.received` events sent by an `EventProducer` in this process and
flushed once, measured in the same run. Latency is POST to acknowledgement, p50 and p99. The last
line is `RESULT ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

TOKEN = "bench-token-" + "x" * 16


def item(i: int, run: str) -> dict:
    return {"feedback_id": f"{run}-{i}", "kind": "rating", "rating": (i % 21 - 10) / 10, "response_id": f"resp-{i}",
            "conversation_id": f"conv-{i % 997}"}


def raw_rate(log, topics, items: list[dict]) -> float:
    from rollwire.bus import EventProducer
    from rollwire.producers.feedback_api import to_event
    events = [to_event(i, "bench") for i in items]
    producer = EventProducer(log.producer(), topics, name="bench")
    producer.send(topics.feedback, events[0], key=events[0].key)  # warm: metadata, the idempotent producer's id
    producer.flush()
    t0 = time.perf_counter()
    for e in events:
        producer.send(topics.feedback, e, key=e.key)
    producer.flush()
    rate = len(events) / (time.perf_counter() - t0)
    producer.close()
    return rate


async def post_singles(url: str, items: list[dict], concurrency: int) -> tuple[float, list[float]]:
    import aiohttp
    latencies: list[float] = []
    queue = list(reversed(items))
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {TOKEN}"},
                                     connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        async def worker() -> None:
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                async with http.post("/v1/feedback", json=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(items) / (time.perf_counter() - t0), latencies


async def post_batches(url: str, items: list[dict], size: int) -> float:
    import aiohttp
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        t0 = time.perf_counter()
        for start in range(0, len(items), size):
            async with http.post("/v1/feedback/batch", json=items[start:start + size]) as response:
                counts = (await response.json())["counts"]
                assert counts["stored"] == len(items[start:start + size]), counts
        return len(items) / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5000, help="items per measurement (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=64, help="single-item requests at once (default %(default)s)")
    parser.add_argument("--batch", type=int, default=500, help="items per batch request (default %(default)s)")
    parser.add_argument("--bus", choices=["kafka", "embedded"], default="kafka")
    args = parser.parse_args()

    from bus import start_broker

    from rollwire.bus import EmbeddedBusSettings, KafkaBusSettings, catalog_topics, open_log
    from rollwire.schemas import Topics

    stop_broker = None
    if args.bus == "kafka":
        bootstrap, stop_broker = start_broker()
        settings = KafkaBusSettings(bootstrap_servers=bootstrap)
        bus = ["--bus", "kafka", "--bootstrap", bootstrap]
    else:
        settings = EmbeddedBusSettings(path=Path(tempfile.mkdtemp(prefix="bench-feedback-")))
        bus = ["--log-dir", str(settings.path)]
    run = uuid.uuid4().hex[:8]
    topics = Topics(f"bench{run}")
    server = None
    try:
        log = open_log(settings)
        log.create_topics(catalog_topics(topics))
        raw = raw_rate(log, topics, [item(i, "raw") for i in range(args.items)])
        server = subprocess.Popen([sys.executable, "-m", "rollwire", "feedback", "serve", "--port", "0",
                                   "--prefix", topics.prefix, *bus], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "ROLLWIRE_FEEDBACK_TOKENS": f"bench={TOKEN}"})
        url = "http://127.0.0.1:" + re.search(r":(\d+)", server.stdout.readline()).group(1)
        singles, latencies = asyncio.run(post_singles(url, [item(i, "one") for i in range(args.items)],
                                                      args.concurrency))
        batched = asyncio.run(post_batches(url, [item(i, "batch") for i in range(args.items)], args.batch))
        log.close()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        if stop_broker:
            stop_broker()
    latencies.sort()
    p50, p99 = statistics.median(latencies) * 1000, latencies[int(0.99 * (len(latencies) - 1))] * 1000
    print(f"{args.items} rating items on {args.bus}; singles at {args.concurrency} requests at once, "
          f"batches of {args.batch}")
    print(f"{'':<34} {'items/s':>9} {'vs raw':>7}")
    for label, value in (("raw producer, one flush (baseline)", raw), ("HTTP, one item a request", singles),
                         ("HTTP, batches", batched)):
        print(f"{label:<34} {value:9,.0f} {value / raw:7.2f}")
    print(f"POST to acknowledgement, single items: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    print(f"RESULT raw_ips={raw:.4g} single_ips={singles:.4g} batch_ips={batched:.4g} single_vs_raw={singles / raw:.3g} "
          f"batch_vs_raw={batched / raw:.3g} p50_ms={p50:.3g} p99_ms={p99:.3g}")


if __name__ == "__main__":
    main()
