"""CPU per request of rollwire's HTTP client, many threads on one pool, next to raw urllib3 and httpx.

    python bench/http_client.py [--threads 64] [--requests 6000]

An env worker calls its vLLM server from dozens of rollout threads at once (tokenize, generate,
detokenize), on a machine whose CPUs the server needs. This measures the CPU time per small JSON
request (client and a local threaded server in the same process, so both sides count) with:

    urllib3 (baseline)   a bare urllib3 PoolManager: the floor our client is built on
    rollwire JsonClient  `rollwire.core.http.JsonClient`: the same pool, JSON encoding, typed errors
    httpx                an httpx.Client with a pool of the same size (the alternative we measured)

The last line is `RESULT ...` with each client's CPU per request relative to the baseline.
"""

from __future__ import annotations

import argparse
import http.server
import json
import socketserver
import sys
import threading
import time


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"tokens": [1, 2, 3, 4, 5, 6, 7, 8]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def measure(call, threads: int, requests: int) -> tuple[float, float]:
    """(requests per second, CPU ms per request) for `call` from `threads` threads."""
    per_thread = requests // threads

    def work() -> None:
        for _ in range(per_thread):
            call()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    cpu, wall = time.process_time(), time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done = per_thread * threads
    return done / (time.perf_counter() - wall), (time.process_time() - cpu) / done * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=64, help="threads sharing one client (default: %(default)s)")
    parser.add_argument("--requests", type=int, default=6000, help="requests per client (default: %(default)s)")
    args = parser.parse_args()

    import httpx
    import urllib3

    from rollwire.core.http import JsonClient

    server = _Server(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    body = {"prompt": "r:1234>", "add_special_tokens": False}
    pool = urllib3.PoolManager(maxsize=args.threads, retries=False)
    ours = JsonClient(base, max_connections=args.threads)
    other = httpx.Client(limits=httpx.Limits(max_connections=args.threads, max_keepalive_connections=args.threads))
    clients = {
        "urllib3 (baseline)": lambda: json.loads(pool.request("POST", base + "/tokenize", body=json.dumps(body).encode(),
                                                              headers={"Content-Type": "application/json"}).data),
        "rollwire JsonClient": lambda: ours.request("POST", "/tokenize", body),
        "httpx": lambda: other.post(base + "/tokenize", json=body).json(),
    }
    results = {}
    print(f"{args.threads} threads, {args.requests} requests each, server in the same process")
    for name, call in clients.items():
        call()  # connect once outside the measurement
        results[name] = measure(call, args.threads, args.requests)
        rate, cpu = results[name]
        print(f"{name:<22} {rate:8.0f} req/s  {cpu:6.3f} ms CPU per request", flush=True)
    server.shutdown()
    baseline = results["urllib3 (baseline)"][1]
    print("RESULT http_client: " + " ".join(f"{name.split()[0].lower()}_cpu_vs_urllib3={cpu / baseline:.2f}"
                                           for name, (_, cpu) in results.items() if "baseline" not in name)
          + f" threads={args.threads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
