"""Long-running Unix-socket MCP server for the mcpmesh interop tests (official Python SDK, `mcp` 2.3.0).

Usage:
    python socket_server.py PATH [--jwks FILE]

Binds a Unix stream socket at PATH (a stale socket file there is replaced), prints exactly one
line `listening on PATH` to stderr once connections are accepted, and serves every accepted
connection as an independent MCP session of the server object of tests/interop/modern_server.py
(tools echo/add/whoami/confirm, resource mcpmesh://interop/hello, prompt greet).

Framing on each connection is MCP's stdio framing: one JSON-RPC message per line, UTF-8,
`\\n`-terminated, in both directions. This is what mcpmesh's `socket` backend speaks.

Each connection runs the SDK's dual-era loop on its own (`Server.run` ->
`mcp.server.runner.serve_dual_era_loop`), so the protocol era is decided per connection by its
first request: `initialize` opens a handshake-era (2025-11-25) session, a request carrying the
`io.modelcontextprotocol/protocolVersion` `_meta` envelope opens a stateless 2026-07-28 one.
Concurrent connections are independent; a connection closing (or failing) ends only its own
session. Runs until SIGTERM/SIGINT, then closes every connection, removes PATH and exits 0.
No network: Unix socket only.

--jwks FILE: the `whoami` tool also reports `caller`: the claims of the signed caller assertion
the node put in the request's `_meta["mcpmesh/caller"]`, verified with PyJWT against FILE
(`mcpmesh id --jwks`) for the audience `unix:PATH` (tests/interop/caller_check.py), or
`{"refused": "<PyJWT error class>: <message>"}` when it does not verify.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
from typing import Any

import anyio
import anyio.abc
import mcp_types as types

from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modern_server  # noqa: E402  (the `mcp.run("stdio")` there is under `if __name__ == "__main__"`)

READ_CHUNK = 65536


def log(msg: str) -> None:
    print(f"socket_server: {msg}", file=sys.stderr, flush=True)


async def read_lines(conn: anyio.abc.ByteReceiveStream, sink: Any) -> None:
    """Split the connection's bytes into `\\n`-terminated lines and feed parsed messages to `sink`.

    Mirrors `mcp.server.stdio.stdio_server`'s reader: UTF-8 (invalid bytes replaced), each line
    parsed with `types.jsonrpc_message_adapter`; an unparsable line is passed on as the exception
    (the dispatcher answers/logs it) instead of killing the session. Blank lines are ignored. A
    final line without its `\\n` before EOF is still delivered. EOF closes `sink`, which ends the
    session exactly like stdin EOF does for a stdio server.
    """

    async def deliver(raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if not text.strip():
            return
        try:
            message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except Exception as exc:  # noqa: BLE001 - handed to the dispatcher like stdio does
            await sink.send(exc)
            return
        await sink.send(SessionMessage(message))

    buf = bytearray()
    try:
        async with sink:
            while True:
                try:
                    chunk = await conn.receive(READ_CHUNK)
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    break
                start = 0
                while (nl := chunk.find(b"\n", start)) != -1:
                    if buf:
                        buf += chunk[start:nl]
                        line = bytes(buf)
                        buf.clear()
                    else:
                        line = chunk[start:nl]
                    await deliver(line)
                    start = nl + 1
                buf += chunk[start:]
            if buf:
                await deliver(bytes(buf))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        # The session already stopped reading (it is shutting down); nothing left to deliver.
        pass


async def write_lines(conn: anyio.abc.ByteSendStream, source: Any, on_broken: anyio.CancelScope) -> None:
    """Serialize each outgoing message as one line (same dump as `stdio_server`'s writer)."""
    try:
        async with source:
            async for session_message in source:
                line = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await conn.send(line.encode("utf-8") + b"\n")
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        # The peer went away mid-write: end this session (only this one).
        on_broken.cancel()


async def serve_connection(conn: anyio.abc.SocketStream, number: int) -> None:
    """One accepted connection = one MCP session of modern_server's server, era chosen by the client."""
    server = modern_server.mcp._lowlevel_server  # same unwrap as mcp.client._memory.InMemoryTransport
    try:
        async with conn:
            # Same stream shapes stdio_server() yields: context-aware memory object streams.
            read_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
            write_stream, write_reader = create_context_streams[SessionMessage](0)
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_lines, conn, read_writer)
                writer_done = anyio.Event()

                async def writer() -> None:
                    try:
                        await write_lines(conn, write_reader, tg.cancel_scope)
                    finally:
                        writer_done.set()

                tg.start_soon(writer)
                # Returns when the read side reaches EOF; serve_dual_era_loop closes write_stream on
                # the way out, so the writer drains every queued response and then finishes.
                await server.run(read_stream, write_stream, server.create_initialization_options())
                await writer_done.wait()
                # Stop the reader too (only still running if the session ended without EOF).
                tg.cancel_scope.cancel()
    except Exception as exc:  # noqa: BLE001 - one broken session must never stop the listener
        log(f"connection {number} failed: {type(exc).__name__}: {exc}")


async def main(path: str) -> None:
    listener = await anyio.create_unix_listener(path)
    bound = os.stat(path)
    try:
        async with listener, anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            # The socket is bound and listening: connects from now on are queued and accepted.
            print(f"listening on {path}", file=sys.stderr, flush=True)
            number = 0
            while True:
                conn = await listener.accept()
                number += 1
                tg.start_soon(serve_connection, conn, number)
    finally:
        # Remove the socket file, unless someone else has replaced it meanwhile.
        try:
            st = os.stat(path)
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino):
                os.unlink(path)
        except OSError:
            pass


def check_callers(jwks: str, path: str) -> None:
    import jwt
    from caller_check import CallerCheck

    check = CallerCheck(jwks, f"unix:{path}")

    def caller(ctx: Any) -> dict[str, Any]:
        meta = ctx.request_context.meta or {}
        try:
            return check.claims(meta.get("mcpmesh/caller"))
        except jwt.PyJWTError as exc:
            return {"refused": f"{type(exc).__name__}: {exc}"}

    modern_server.CALLER_CHECK = caller


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[1] == "--jwks":
        check_callers(args[2], args[0])
    elif len(args) != 1:
        sys.exit("usage: socket_server.py PATH [--jwks FILE]")
    anyio.run(main, args[0])
    sys.exit(0)
