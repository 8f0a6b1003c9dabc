"""One inference replica: a managed vLLM server and its weight subscriber, supervised.

    rollwire inference --model DIR [--bus kafka ...] [--store s3 ...]

    start server -> publish `starting` -> catch up to the latest version -> loop:
        follow the weights topic (WeightSubscriber.poll)
        server died?  publish `failed` with its exit code, start it again, reload the served version
    SIGTERM / Ctrl-C -> stop the server (process group) -> publish `stopped`
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from rollwire.consumers.vllm_server import VllmServer, VllmServerSettings
from rollwire.consumers.weight_subscriber import WeightSubscriber, WeightSubscriberSettings
from rollwire.core.bus import EventLog
from rollwire.core.objectstore import ObjectStore
from rollwire.schemas.topics import Topics

logger = logging.getLogger(__name__)


class Replica:
    """Keeps one server serving the newest verified version until stopped."""

    def __init__(self, log: EventLog, topics: Topics, store: ObjectStore, server: VllmServerSettings,
                 subscriber: WeightSubscriberSettings, *, max_restarts: int = 5) -> None:
        self.server = VllmServer(server)
        if subscriber.url is None:
            subscriber = subscriber.model_copy(update={"url": self.server.base_url})
        base = Path(server.model)
        self.subscriber = WeightSubscriber(log, topics, store, self.server.control, subscriber,
                                           base_model_dir=base if base.is_dir() else None)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        """Runs until `stop()` or SIGTERM; raises if the server keeps dying."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.subscriber.report("starting")
        self.server.start()
        logger.info("vLLM serves at %s", self.server.base_url)
        try:
            if self.subscriber.catch_up() is None:
                self.subscriber.report("serving")  # the base model: routers may send it work now
            while not self.stopping.is_set():
                if not self.server.alive():
                    self._restart()
                self.subscriber.poll(timeout_s=1.0)
                self.subscriber.heartbeat()
        finally:
            self.server.stop()
            self.subscriber.report("stopped")
            self.subscriber.close()

    def _restart(self) -> None:
        code = self.server.process.returncode if self.server.process else None
        self.restarts += 1
        if self.restarts > self.max_restarts:
            self.subscriber.report("failed", reason=f"vLLM exited (code {code}) {self.restarts} times; giving up")
            raise RuntimeError(f"vLLM keeps exiting (last code {code}); see its log")
        self.subscriber.report("failed", reason=f"vLLM exited with code {code}; restarting it "
                                                f"({self.restarts} of {self.max_restarts})")
        self.server.start()
        self.subscriber.reapply()

    def stop(self) -> None:
        self.stopping.set()
