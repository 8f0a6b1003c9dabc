"""Feedback items acknowledged per second through the HTTP API, against the raw producer writing the
same events, on Kafka (and the embedded log with --bus embedded).

    python bench/feedback.py [--items N] [--concurrency C] [--batch B] [--bus kafka|embedded]

The API runs as `rollwire feedback serve` in its own process; clients post from this one with
aiohttp's client (httpx, measured first, capped the rate at ~550 requests/s on its own): single
items at `--concurrency` requests at once (an app posting as users click), then
batches of `--batch` items. Each item is acknowledged only once the log holds it. The baseline is
the limit: the same `feedback.received` events sent by an `EventProducer` in this process and
flushed once, measured in the same run. Latency is POST to acknowledgement, p50 and p99.

Then the whole path: `rollwire join` runs too, the served records of `--joined` receipts are on
`served`, and ratings on them are posted one at a time (`--joined-rate` a second, as users click);
latency is POST to the joined sample readable on `scored` (a reader in this process tails it),
p50 and p99. The last line is `RESULT ...`.
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
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

TOKEN = "bench-token-" + "x" * 16
WARM = 50
"""Ratings posted through the whole path before the timed ones."""


def item(i: int, run: str) -> dict:
    return {"feedback_id": f"{run}-{i}", "kind": "rating", "rating": (i % 21 - 10) / 10, "response_id": f"resp-{i}",
            "conversation_id": f"conv-{i % 997}"}


def raw_rate(log, topics, items: list[dict]) -> float:
    from rollwire.core.bus import EventProducer
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


def served_records(log, topics, receipts: list[str]) -> None:
    from rollwire.core.bus import EventProducer
    from rollwire.schemas import InferenceCall, ResponseServed, WeightVersionSpan
    call = InferenceCall(prompt_token_ids=[1, 40, 41, 42], completion_token_ids=[50, 51, 52, 2],
                         completion_logprobs=[-0.5, -0.25, -0.1, -0.05],
                         weight_versions=[WeightVersionSpan(version=0, start=0, end=4)], finish_reason="stop")
    producer = EventProducer(log.producer(), topics, name="bench")
    for receipt in receipts:
        record = ResponseServed(response_id=receipt, source="bench", endpoint="chat", model="policy",
                                messages=[{"role": "user", "content": "hi"}], call=call, completion="abc")
        producer.send(topics.served, record, key=record.key)
    producer.flush()
    producer.close()


class ScoredTail(threading.Thread):
    """When each sample id first became readable on `scored` (perf_counter seconds)."""

    def __init__(self, log, topics) -> None:
        super().__init__(daemon=True)
        from rollwire.core.bus import Beginning
        self.reader = log.reader([topics.scored], Beginning())
        self.seen: dict[str, float] = {}
        self.stopping = False

    def run(self) -> None:
        from rollwire.schemas import Codec
        codec = Codec()
        while not self.stopping:
            for record in self.reader.poll_batch(1000, 0.05):
                now = time.perf_counter()
                self.seen.setdefault(codec.decode(record.value).event.rollout.rollout_id, now)

    def wait_for(self, ids: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(i in self.seen for i in ids):
            if time.monotonic() > deadline:
                raise SystemExit(f"{sum(i not in self.seen for i in ids)} of {len(ids)} samples never reached scored")
            time.sleep(0.02)


async def post_paced(url: str, items: list[dict], rate: float) -> dict[str, float]:
    """Posts `items` one a request at `rate` a second; returns when each POST started."""
    import aiohttp
    started: dict[str, float] = {}
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async def post(body: dict) -> None:
            started[body["feedback_id"]] = time.perf_counter()
            async with http.post("/v1/feedback", json=body) as response:
                assert response.status == 200, await response.text()
                await response.read()

        tasks = []
        t0 = time.perf_counter()
        for n, body in enumerate(items):
            await asyncio.sleep(max(0.0, t0 + n / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(post(body)))
        await asyncio.gather(*tasks)
    return started


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    values = sorted(values)
    return statistics.median(values) * 1000, values[int(0.99 * (len(values) - 1))] * 1000


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
    parser.add_argument("--joined", type=int, default=500, help="ratings timed to scored (default %(default)s)")
    parser.add_argument("--joined-rate", type=float, default=100.0, help="their posts a second (default %(default)s)")
    parser.add_argument("--bus", choices=["kafka", "embedded"], default="kafka")
    args = parser.parse_args()

    from bus import start_broker

    from rollwire.core.bus import EmbeddedBusSettings, KafkaBusSettings, catalog_topics, open_log
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
    server = joiner = None
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
        # the whole path: POST -> ingestion -> feedback topic -> joiner -> scored
        receipts = [f"resp-e2e-{i}" for i in range(args.joined + WARM)]
        served_records(log, topics, receipts)
        joiner = subprocess.Popen([sys.executable, "-m", "rollwire", "join", "--prefix", topics.prefix, *bus],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tail = ScoredTail(log, topics)
        tail.start()
        # the joiner's start and its first polls, not timed (a stall of 0.1-0.3 s about 10 items in on Kafka)
        warm = [{**item(i, "warm"), "response_id": receipts[args.joined + i]} for i in range(WARM)]
        asyncio.run(post_paced(url, warm, args.joined_rate))
        tail.wait_for([w["feedback_id"] for w in warm], 120)
        paced = [{**item(i, "e2e"), "response_id": receipts[i]} for i in range(args.joined)]
        started = asyncio.run(post_paced(url, paced, args.joined_rate))
        tail.wait_for(list(started), 120)
        tail.stopping = True
        tail.join()
        joined = [tail.seen[i] - t for i, t in started.items()]
        log.close()
    finally:
        for process in (server, joiner):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
        if stop_broker:
            stop_broker()
    p50, p99 = percentiles(latencies)
    j50, j99 = percentiles(joined)
    print(f"{args.items} rating items on {args.bus}; singles at {args.concurrency} requests at once, "
          f"batches of {args.batch}")
    print(f"{'':<34} {'items/s':>9} {'vs raw':>7}")
    for label, value in (("raw producer, one flush (baseline)", raw), ("HTTP, one item a request", singles),
                         ("HTTP, batches", batched)):
        print(f"{label:<34} {value:9,.0f} {value / raw:7.2f}")
    print(f"POST to acknowledgement, single items: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    print(f"POST to the joined sample on scored, {args.joined} ratings at {args.joined_rate:g}/s: "
          f"p50 {j50:.1f} ms, p99 {j99:.1f} ms")
    print(f"RESULT raw_ips={raw:.4g} single_ips={singles:.4g} batch_ips={batched:.4g} single_vs_raw={singles / raw:.3g} "
          f"batch_vs_raw={batched / raw:.3g} p50_ms={p50:.3g} p99_ms={p99:.3g} joined_p50_ms={j50:.3g} "
          f"joined_p99_ms={j99:.3g}")


if __name__ == "__main__":
    main()
