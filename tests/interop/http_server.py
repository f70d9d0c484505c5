"""Streamable HTTP MCP server for the mcpmesh interop tests (official Python SDK, `mcp` 2.3.0).

Usage:
    python http_server.py [--port N] [--jwks FILE]

Serves the server object of tests/interop/modern_server.py (tools echo/add/whoami/confirm,
resource mcpmesh://interop/hello, prompt greet) over the SDK's Streamable HTTP transport at
http://127.0.0.1:PORT/mcp, loopback only. `--port 0` (the default) lets the kernel pick a free
port. Once connections are accepted, prints exactly one line to stderr:

    listening on http://127.0.0.1:PORT/mcp

Both protocol eras are served on the one endpoint, routed per HTTP request by the SDK's
`StreamableHTTPSessionManager._handle_request` on the `MCP-Protocol-Version` header:

* absent, or a handshake-era version (2025-11-25 and older): the stateful transport. `initialize`
  (no `Mcp-Session-Id`) opens a session whose id comes back in `Mcp-Session-Id`; later POSTs,
  the GET stream and the closing DELETE carry it. Answers are SSE (`json_response=False`).
* any other value (2026-07-28): `mcp.server._streamable_http_modern.handle_modern_request`, one
  self-contained POST per request, no session id. The SDK checks the per-request headers against
  the body: `MCP-Protocol-Version` must equal `_meta["io.modelcontextprotocol/protocolVersion"]`,
  `Mcp-Method` must equal the body's method, and for tools/call, prompts/get and resources/read
  `Mcp-Name` must equal params.name / params.uri; a mismatch or a missing header is refused
  (HTTP 400, JSON-RPC HEADER_MISMATCH). The answer is `application/json` unless the handler emits
  a notification or runs longer than 15 s, in which case it is an SSE stream.

Limits: request bodies up to 16 MiB (the SDK's `max_request_body_size`, default 4 MiB, enforced by
`RequestBodyLimitMiddleware` in front of both eras; over the cap: 413). The server side has no
cap on response / SSE event size, so a 4 MiB echo (about 2 x 5 MB of escaped JSON back: content
plus structuredContent) goes through; a client has to lift its own SSE event cap (the SDK client's
default is 1 MiB: `streamable_http_client(..., max_sse_event_size=None)`).

Host/Origin checks: the SDK's loopback defaults (`streamable_http_app(host="127.0.0.1")` turns on
DNS-rebinding protection allowing Host `127.0.0.1:*`, `localhost:*`, `[::1]:*` and the matching
http:// Origins); they accept `Host: 127.0.0.1:PORT` as is, so they are left alone.

Request log: every HTTP request that reaches the app is logged to stderr on arrival, one line:

    request: POST /mcp mcp-method=tools/call mcp-name=echo mcp-protocol-version=2026-07-28 mcp-session-id=absent

Header values are printed verbatim (an absent header prints as `-`); only the presence of
`Mcp-Session-Id` is shown (`present` / `absent`), never its value.

--jwks FILE: every HTTP request must carry a valid mcpmesh caller assertion in the
`Mcpmesh-Caller` header, checked with PyJWT (a third-party JOSE library) against the keys of
FILE (`mcpmesh id --jwks`): EdDSA only, `kid` found in FILE, `iss` = "eid:" + kid, `aud` = this
server's URL exactly, `exp`/`iat`/`sub`/`jti` present, not expired (no leeway). A request that
fails is answered HTTP 401 `{"error": "invalid caller assertion", "reason": "<PyJWT error>"}`
and logged `caller refused: <PyJWT error class>: <message>` (a request without the header:
`InvalidTokenError: no assertion`); one that passes is logged
`caller: <claims as JSON, sorted, without jti>`. The `whoami` tool then also reports the
claims of the request that called it, as `caller`. Tokens are never printed.

SIGTERM/SIGINT: stop accepting, let in-flight requests finish (open streams get 2 s, then are
cancelled), run the app's shutdown (ends every session) and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from typing import Any

import jwt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modern_server  # noqa: E402  (the `mcp.run("stdio")` there is under `if __name__ == "__main__"`)
from caller_check import CallerCheck  # noqa: E402
import loopback_asgi  # noqa: E402

HOST = "127.0.0.1"
PATH = "/mcp"
MAX_REQUEST_BODY = 16 * 1024 * 1024
LOGGED_HEADERS = (b"mcp-method", b"mcp-name", b"mcp-protocol-version")


def request_line(scope: dict[str, Any]) -> str:
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", []):
        headers.setdefault(name.lower(), value)  # first occurrence, as Starlette's Headers.get does
    fields = [f"{name.decode()}={headers[name].decode('latin-1') if name in headers else '-'}" for name in LOGGED_HEADERS]
    fields.append("mcp-session-id=" + ("present" if b"mcp-session-id" in headers else "absent"))
    path = scope.get("path", "")
    if scope.get("query_string"):
        path += "?" + scope["query_string"].decode("latin-1")
    return f"request: {scope.get('method', '?')} {path} " + " ".join(fields)


CALLER_HEADER = "mcpmesh-caller"


class RequireCaller:
    """ASGI wrapper: refuse (401) every HTTP request without a valid caller assertion."""

    def __init__(self, app: Any, check: CallerCheck) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = None
        for name, value in scope.get("headers", []):
            if name.lower() == CALLER_HEADER.encode():
                token = value.decode("latin-1")
                break
        try:
            claims = self.check.claims(token)
        except jwt.PyJWTError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            print(f"caller refused: {reason}", file=sys.stderr, flush=True)
            body = json.dumps({"error": "invalid caller assertion", "reason": reason}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        shown = {k: v for k, v in claims.items() if k != "jti"}
        print(f"caller: {json.dumps(shown, sort_keys=True)}", file=sys.stderr, flush=True)
        await self.app(scope, receive, send)


class RequestLog:
    """ASGI wrapper: one stderr line per HTTP request, then hand the request to the SDK app unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            print(request_line(scope), file=sys.stderr, flush=True)
        await self.app(scope, receive, send)


async def serve(port: int, jwks: str | None) -> None:
    def build(bound_port: int) -> Any:
        app = modern_server.mcp.streamable_http_app(
            streamable_http_path=PATH,
            max_request_body_size=MAX_REQUEST_BODY,
            host=HOST,  # -> the SDK's loopback DNS-rebinding defaults (Host 127.0.0.1:* etc. allowed)
        )
        if jwks is not None:
            check = CallerCheck(jwks, f"http://{HOST}:{bound_port}{PATH}")
            modern_server.CALLER_CHECK = lambda ctx: check.claims(
                ctx.request_context.request.headers.get(CALLER_HEADER)
            )
            app = RequireCaller(app, check)
        return RequestLog(app)

    await loopback_asgi.serve(port, build, PATH, lambda line: print(line, file=sys.stderr, flush=True))


def main() -> int:
    parser = argparse.ArgumentParser(prog="http_server.py")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--jwks", help="require a caller assertion verified against this JWKS file")
    options = parser.parse_args()
    if not 0 <= options.port <= 65535:
        parser.error(f"bad port {options.port}")
    # uvicorn's Server.serve() installs its own SIGTERM/SIGINT handlers (graceful shutdown) and, on
    # the way out, restores the previous handlers and re-raises the captured signal. With the
    # default handlers in place that would kill the process by the signal after a clean shutdown;
    # these no-op handlers make the re-raise harmless, so a SIGTERM ends in a normal exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        asyncio.run(serve(options.port, options.jwks))
    except OSError as exc:
        print(f"http_server: cannot listen on {HOST}:{options.port}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
