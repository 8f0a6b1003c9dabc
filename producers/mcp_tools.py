"""Tools from MCP servers (the Model Context Protocol, through the `mcp` package): a server's tools
become a taskset's tools, their schemas the server's own, each call a `tools/call` request.

    class Files(McpServer):                 # a file server over stdio
        command = ["python3", "servers/files.py"]
        per_rollout = True          # a server of its own per rollout (state: its files); default shared

    class Edits(Taskset):
        harness = "chat"
        tools = [Files]             # every tool it lists; a row's "tools": ["read"] offers a subset

A shared server (the default) is started once per process, on first use, and serves every rollout
of that process: for stateless tools (a search API, a calculator). With `per_rollout = True` each
rollout starts its own server before its first call and stops it after its last, even when the
rollout fails (an `McpServer` is a `Toolbox`): for tools that keep state a rollout must not share.
Each start costs the server's start-up (about 2 s for a Python server here), so prefer shared
servers where the tools allow.

The server's tool list is read when the taskset's tools are first needed (a shared listing
server per process); a server that does not start or answer is a `ConfigError` naming its command
and what it printed. A tool's result comes back to the model as its text content; a call the
server refuses or fails (`isError`), or one that takes longer than `call_timeout_s`, comes back as
an `error: ...` message the model can read. References name a server's tool as
`package.module:Files#read`, so a harness in a subprocess finds the same one.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ClassVar

from rollwire.core.errors import ConfigError
from rollwire.producers.tools import Tool, Toolbox


class McpError(RuntimeError):
    """The server answered a call with an error; the model reads the message."""


class McpConnection:
    """One MCP server process and its client session, on an event loop thread of its own, so that
    synchronous harness threads can call it (calls from several threads run concurrently)."""

    def __init__(self, command: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 startup_timeout_s: float = 60.0) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self.command = command
        self._errors = tempfile.TemporaryFile(mode="w+")  # the server's stderr, for the message if it fails
        params = StdioServerParameters(command=command[0], args=command[1:], env={**os.environ, **(env or {})},
                                       cwd=cwd)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-" + os.path.basename(command[0]),
                                        daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        ready: Future = Future()

        async def hold() -> None:  # enters and leaves the transport's contexts in one task, as anyio requires
            self._stop = asyncio.Event()
            try:
                async with stdio_client(params, errlog=self._errors) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        self._session = session
                        ready.set_result(None)
                        await self._stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._main = asyncio.run_coroutine_threadsafe(hold(), self._loop)
        try:
            ready.result(timeout=startup_timeout_s)
        except Exception as exc:
            printed = self._stderr()
            self.close()
            raise ConfigError(f"the MCP server {' '.join(command)} did not start: {_leaves(exc)}{printed}") from None

    def _stderr(self) -> str:
        try:
            self._errors.seek(0)
            text = self._errors.read().strip()
        except (OSError, ValueError):
            return ""
        return f"; it printed: {text[-1000:]}" if text else ""

    def _run(self, coroutine: Any, timeout_s: float) -> Any:
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, timeout_s), self._loop).result()

    def list_tools(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The server's tools as the protocol writes them (`name`, `description`, `inputSchema`)."""
        found: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = self._run(self._session.list_tools(cursor) if cursor else self._session.list_tools(), timeout_s)
            found += [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in page.tools]
            cursor = getattr(page, "nextCursor", None) or getattr(page, "next_cursor", None)
            if not cursor:
                return found

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> str:
        """The call's text content; `McpError` with the server's message when it says the call failed."""
        try:
            result = self._run(self._session.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            raise McpError(f"{name} took longer than {timeout_s:g} s") from None
        answer = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        text = "\n".join(block.get("text", "") for block in answer.get("content", []) if block.get("type") == "text")
        if not text and answer.get("structuredContent") is not None:
            text = json.dumps(answer["structuredContent"])
        if answer.get("isError"):
            raise McpError(text or "the server reported an error")
        return text

    def close(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._main.result(timeout=10)
        except Exception:  # noqa: S110 - a server that failed to start, or will not stop: the loop ends anyway
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._errors.close()


def _leaves(exc: BaseException) -> str:
    """What went wrong, with exception groups (anyio's task groups) opened to their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaves(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpServer(Toolbox):
    """A taskset's tools from an MCP server over stdio: subclass it and set `command`."""

    command: ClassVar[list[str]] = []
    """The program and its arguments that serve MCP on stdin/stdout."""
    env: ClassVar[dict[str, str]] = {}
    """Environment variables for the server, over this process's."""
    cwd: ClassVar[str | None] = None
    prefix: ClassVar[str] = ""
    """Put before each tool's name as the model sees it (two servers with a tool of the same name)."""
    per_rollout: ClassVar[bool] = False
    """A server per rollout (started before its first call, stopped after its last), else one per process."""
    call_timeout_s: ClassVar[float] = 60.0
    startup_timeout_s: ClassVar[float] = 60.0

    connection: McpConnection | None = None
    """This rollout's server (`per_rollout`)."""

    @classmethod
    def connect(cls) -> McpConnection:
        if not cls.command:
            raise ConfigError(f"MCP server {cls.__qualname__} has no command: set `command = [program, args...]`")
        return McpConnection(list(cls.command), env=dict(cls.env), cwd=cls.cwd, startup_timeout_s=cls.startup_timeout_s)

    @classmethod
    def shared(cls) -> McpConnection:
        """The process's one connection to this server (listing, and every call of a shared server)."""
        with _LOCK:
            if cls not in _SHARED:
                _SHARED[cls] = cls.connect()
            return _SHARED[cls]

    @classmethod
    def tools(cls) -> list[Tool]:
        with _LOCK:
            if cls not in _LISTED:
                _LISTED[cls] = [cls._tool(spec) for spec in cls.shared().list_tools()]
            return _LISTED[cls]

    @classmethod
    def _tool(cls, spec: dict[str, Any]) -> Tool:
        name, timeout_s = spec["name"], cls.call_timeout_s
        function: Callable[..., str]
        if cls.per_rollout:
            def function(self: McpServer, **arguments: Any) -> str:
                assert self.connection is not None, "set up by the rollout's ToolSet"
                return self.connection.call(name, arguments, timeout_s)
        else:
            def function(**arguments: Any) -> str:
                return cls.shared().call(name, arguments, timeout_s)
        return Tool(name=cls.prefix + name, description=spec.get("description") or name, function=function,
                    arguments=None,
                    toolbox=cls if cls.per_rollout else None, parameters=spec.get("inputSchema") or {"type": "object"},
                    source=cls)

    def setup(self, row: dict) -> None:
        if self.per_rollout:
            self.connection = self.connect()

    def teardown(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


_LOCK = threading.RLock()
_SHARED: dict[type[McpServer], McpConnection] = {}
_LISTED: dict[type[McpServer], list[Tool]] = {}


@atexit.register
def _close_shared() -> None:
    for connection in list(_SHARED.values()):
        connection.close()
    _SHARED.clear()
