"""Dual-era stdio MCP server for the mcpmesh interop tests (official Python SDK, `mcp` 2.3.0).

Serves BOTH protocol eras on one stdio connection, decided by the client's first request:

* handshake era (`initialize`, 2025-11-25 and older), and
* the stateless 2026-07-28 revision (`server/discover`, per-request `_meta` envelope,
  multi-round-trip `input_required` results).

`MCPServer.run("stdio")` -> `Server.run` -> `mcp.server.runner.serve_dual_era_loop`, which
peeks at the first JSON-RPC request: a non-`initialize` request carrying the
`io.modelcontextprotocol/protocolVersion` `_meta` envelope opens a modern connection, anything
else a legacy one. Nothing here is era-specific except `confirm`, whose `Resolve(...)`/`Elicit`
parameter the SDK fulfils per era:

* 2026-07-28: the first `tools/call` returns `{"resultType": "input_required",
  "inputRequests": {...elicitation/create...}, "requestState": "<sealed>"}`; the tool body runs
  only on the client's retry carrying `inputResponses` + the echoed `requestState`.
* 2025-11-25: the server sends a standalone `elicitation/create` request mid-call.

`requestState` is sealed with a per-process random AES-GCM key (the SDK default), so it is the
only non-deterministic field on the wire besides what the SDK itself randomizes. No network.

Tools: echo(text), add(a, b), whoami, confirm(question). Resource: mcpmesh://interop/hello.
Prompt: greet(name). With MODERN_SERVER_TOUCH=1 in the environment, also touch(uri): publishes
"resource updated" for uri to the `subscriptions/listen` streams (2026-07-28) that named it, and
answers "touched <uri>; N listening", N the listen streams open on this server process (read
from the SDK's in-memory subscription bus) — how a test sees a stream's end reach the server.
"""

from __future__ import annotations

import json
import os
from typing import Annotated

from pydantic import BaseModel, Field

from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve

PEER_META_KEY = "mcpmesh/peer"

# Set by http_server.py / socket_server.py --jwks: checks the signed caller assertion of the
# request (its HTTP header, or its `_meta`) and returns its claims; `whoami` reports them as
# `caller`.
CALLER_CHECK = None

mcp = MCPServer(
    "mcpmesh-interop-modern",
    version="1.0.0",
    instructions="mcpmesh interop test server (dual-era stdio).",
    # Keep stderr quiet: the SDK logs at INFO by default.
    log_level="WARNING",
)


@mcp.tool(description="Return the given text unchanged.")
def echo(text: str) -> str:
    return text


@mcp.tool(description="Add two integers.")
def add(a: int, b: int) -> int:
    return a + b


@mcp.tool(description="Report the mcpmesh peer identity this server process was started for.")
def whoami(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    peer = meta.get(PEER_META_KEY)
    report = {
        "MCPMESH_PEER_EID": os.environ.get("MCPMESH_PEER_EID"),
        "MCPMESH_PEER_NAME": os.environ.get("MCPMESH_PEER_NAME"),
        "MCPMESH_SERVICE": os.environ.get("MCPMESH_SERVICE"),
        "meta_peer": peer,
    }
    if CALLER_CHECK is not None:
        report["caller"] = CALLER_CHECK(ctx)
    return json.dumps(report, sort_keys=True)


class Answer(BaseModel):
    answer: str = Field(description="Your answer to the question")


def ask(question: str) -> Elicit[Answer]:
    """Resolver: always ask the client (elicitation)."""
    return Elicit(f"confirm: {question}", Answer)


@mcp.tool(description="Ask the client a question mid-call (elicitation) and return the answer.")
def confirm(question: str, reply: Annotated[Answer, Resolve(ask)]) -> str:
    return f"{question} -> {reply.answer}"


@mcp.resource("mcpmesh://interop/hello", name="hello", mime_type="text/plain", description="A fixed text resource.")
def hello_resource() -> str:
    return "hello from mcpmesh interop"


@mcp.prompt(description="A one-message greeting prompt.")
def greet(name: str) -> str:
    return f"Please greet {name}."


if os.environ.get("MODERN_SERVER_TOUCH") == "1":

    @mcp.tool(description="Tell the subscribers of a resource that it was updated.")
    async def touch(uri: str, ctx: Context) -> str:
        await ctx.notify_resource_updated(uri)
        listening = len(getattr(ctx._bus, "_listeners", ()))
        return f"touched {uri}; {listening} listening"


if __name__ == "__main__":
    mcp.run("stdio")
