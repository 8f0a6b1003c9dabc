"""rollwire: asynchronous RL post-training for LLMs as an event-sourced streaming system.

The design's folders are subpackages: `rollwire.schemas` lives in `schemas/`, `rollwire.streams`
in `streams/`, and so on (see `pyproject.toml`). This package holds the small shared core: the
event log (`rollwire.core.bus`), telemetry, errors and the command line.
"""

__version__ = "0.1.0"
