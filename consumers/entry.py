"""The inference fleet's front door: `rollwire inference` calls it, and so does `rollwire run` for
each of its `replica` roles.

    serve_replica   weights (or serving decisions) -> a vLLM server on the newest verified version;
                    its status on `fleet`
"""

from __future__ import annotations

from rollwire.consumers.vllm_server import VllmServerSettings
from rollwire.consumers.weight_subscriber import WeightSubscriberSettings
from rollwire.core.bus import EventLog
from rollwire.core.objectstore import ObjectStore
from rollwire.schemas.topics import Topics


def serve_replica(log: EventLog, topics: Topics, store: ObjectStore, server: VllmServerSettings,
                  subscriber: WeightSubscriberSettings) -> None:
    """Serves until Ctrl-C or SIGTERM (which stop its vLLM server too); a crashed server is
    restarted with the version it served, and one that keeps dying raises."""
    from rollwire.consumers.replica import Replica
    try:
        Replica(log, topics, store, server, subscriber).run()
    except KeyboardInterrupt:
        pass
