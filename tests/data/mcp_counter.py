"""An MCP server over stdio for the tests (the `mcp` package's own server): `add` two integers,
`bump` a counter this server process keeps (to tell a shared server from one per rollout), and
`fail`, which always raises. Runs with mcp 2 (`MCPServer`) or mcp 1 (`FastMCP`)."""

try:
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp 1
    from mcp.server.fastmcp import FastMCP as Server

app = Server("counter")
count = 0


@app.tool()
def add(a: int, b: int) -> int:
    """Adds two whole numbers."""
    return a + b


@app.tool()
def bump() -> str:
    """Counts the calls this server has had."""
    global count
    count += 1
    return f"count {count}"


@app.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason."""
    raise ValueError(reason)


if __name__ == "__main__":
    app.run()
