"""Serving an ASGI app on 127.0.0.1 with uvicorn, for the interop test servers
(http_server.py, oauth_server.py).

serve(port, build, path, log) binds 127.0.0.1:port first (0: the kernel picks), so the app can
be built for the real port (`build(bound_port)`), then serves it with uvicorn (no websockets,
quiet, lifespan on, open streams get GRACEFUL_SHUTDOWN_SECONDS on SIGTERM) and logs exactly one
line `listening on http://127.0.0.1:PORT<path>` once connections are accepted: uvicorn's
startup calls listen() on the socket, and `server.started` flips after that and after the app's
lifespan startup has run.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable

import uvicorn

HOST = "127.0.0.1"
GRACEFUL_SHUTDOWN_SECONDS = 2


async def serve(port: int, build: Callable[[int], Any], path: str, log: Callable[[str], None]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((HOST, port))
    except OSError:
        sock.close()
        raise
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        build(bound_port),
        interface="asgi3",
        lifespan="on",
        ws="none",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    server = uvicorn.Server(config)

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.01)
        log(f"listening on http://{HOST}:{bound_port}{path}")

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
        sock.close()
