"""What rollwire's HTTP services share (feedback ingestion, the serving gateway): bearer tokens bound to
sources, what may listen beyond this machine, refusals with a status and a reason, bounded JSON
bodies, and running an aiohttp application until interrupted.

    tokens file  `SOURCE TOKEN` a line  ┐
    $<SERVICE>_TOKENS `SOURCE=TOKEN,...` ┴──▶ {token: source} ──▶ source_of(Authorization header)
                                                                  401 without a known token
    check_exposure(host, tokens): no tokens, no address but loopback
    Refused(status, reason) raised anywhere in a handler ──refusals(render)──▶ that response
    read_body / read_json: 413 over the limit, 400 for what does not parse
    run_app(app, host, port, ready): listens, calls ready(port), serves until interrupted
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rollwire.core.errors import ConfigError

logger = logging.getLogger(__name__)


class Refused(Exception):
    """A request refused as a whole: its HTTP status, reason and headers."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, dict(headers or {})


def load_tokens(path: Path | None, variable: str, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """`{token: source}` from the tokens file and the environment variable `variable`."""
    pairs: list[tuple[str, str]] = []
    if path is not None:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read the tokens file {path}: {exc}") from None
        for number, line in enumerate(lines, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConfigError(f"{path}:{number}: expected `SOURCE TOKEN`, got {len(parts)} words")
            pairs.append((parts[0], parts[1]))
    for item in filter(None, environ.get(variable, "").split(",")):
        source, sep, token = item.partition("=")
        if not sep or not source or not token:
            raise ConfigError(f"{variable} must read SOURCE=TOKEN[,SOURCE=TOKEN...]")
        pairs.append((source.strip(), token.strip()))
    weak = [source for source, token in pairs if len(token) < 16]
    if weak:
        raise ConfigError(f"the tokens of {', '.join(weak)} are shorter than 16 characters: use e.g. "
                          "`python -c 'import secrets; print(secrets.token_urlsafe(24))'`")
    return {token: source for source, token in pairs}


def check_exposure(host: str, tokens: Mapping[str, str], guards: str) -> None:
    """Refuses to listen beyond this machine without tokens; `guards` says what they protect."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not tokens:
        raise ConfigError(f"refusing to listen on {host} without bearer tokens: anyone who can reach it could use "
                          f"{guards}; give --tokens FILE (or the tokens variable), or listen on 127.0.0.1")


def source_of(authorization: str | None, tokens: Mapping[str, str]) -> str | None:
    """The source a request's bearer token is bound to; None when the server has no tokens.
    Raises `Refused(401)` for a missing or unknown token."""
    if not tokens:
        return None
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Refused(401, "send `Authorization: Bearer <token>`", {"WWW-Authenticate": "Bearer"})
    for known, source in tokens.items():  # every token compared, in constant time
        if secrets.compare_digest(known.encode(), token.strip().encode()):
            return source
    raise Refused(401, "unknown bearer token", {"WWW-Authenticate": 'Bearer error="invalid_token"'})


def refusals(render: Callable[[Refused], Any]):
    """aiohttp middleware: a `Refused` raised by a handler becomes the response `render` makes of it."""
    from aiohttp import web

    @web.middleware
    async def middleware(request, handler):
        try:
            return await handler(request)
        except Refused as exc:
            return render(exc)
    return middleware


async def read_body(request, max_bytes: int) -> bytes:
    """The request body; `Refused(413)` over `max_bytes` (the application's `client_max_size`)."""
    from aiohttp import web
    if request.content_length is not None and request.content_length > max_bytes:
        raise Refused(413, f"the body has {request.content_length} bytes; the limit is {max_bytes}")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise Refused(413, f"the body is over the limit of {max_bytes} bytes") from None


async def read_json(request, max_bytes: int) -> Any:
    """The request body parsed as JSON; `Refused(400)` with the reason when it does not parse."""
    try:
        return json.loads(await read_body(request, max_bytes))
    except ValueError as exc:  # UnicodeDecodeError included
        raise Refused(400, f"the body is not JSON: {exc}") from None


SHUTDOWN_GRACE_S = 5.0
"""How long a stopping server lets requests in flight finish."""


def run_app(app, host: str, port: int, *, ready: Callable[[int], None] | None = None,
            describe: Callable[[int], str] = lambda port: "") -> None:
    """Serves `app` on `host:port` until interrupted; logs `describe(port)` and calls `ready(port)`
    once it listens (port 0: the port chosen)."""
    from aiohttp import web

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):  # stop between requests, not wherever the signal lands
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                loop.add_signal_handler(sig, stop.set)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, shutdown_timeout=SHUTDOWN_GRACE_S).start()
        chosen = runner.addresses[0][1]
        logger.info("%s", describe(chosen) or f"listening on http://{host}:{chosen}")
        if ready is not None:
            ready(chosen)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())
