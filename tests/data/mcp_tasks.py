"""A taskset whose tools come from an MCP server (`tests/data/mcp_counter.py`), shared or one per
rollout, as a user would write it (`rollwire.producers.mcp_tools`)."""

import sys
from pathlib import Path

from rollwire.producers.mcp_tools import McpServer
from rollwire.producers.tasksets import RolloutView, Taskset, reward

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_counter.py"))]


class Counter(McpServer):
    command = SERVER


class OwnCounter(McpServer):
    command = SERVER
    per_rollout = True
    prefix = "own_"


class Counting(Taskset):
    name = "counting"
    harness = "chat"
    tools = [Counter, OwnCounter]

    def rows(self):
        yield {"task_id": "c1", "messages": [{"role": "user", "content": "Count."}]}

    @reward("counted")
    def counted(self, r: RolloutView) -> float:
        return float("count" in r.completion)
