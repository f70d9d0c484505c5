#!/usr/bin/env python3
"""Hub driver: the official MCP Python SDK (2.x) as the client of `mcpmesh hub`, one step
at a time, so that a test can look at the mesh between steps.

Usage: hub_client.py -- CMD [ARGS...]

CMD is started as a stdio MCP server (normally `mcpmesh --home DIR hub ...`) and initialized
with sampling and elicitation callbacks. Then each line on stdin is one JSON command, and each
is answered by one JSON line on stdout:

  {"op": "list"}                     -> {"tools": [{"name", "description"}...]}
  {"op": "call", "name", "arguments", "progress": bool}
                                     -> a call's outcome (below)
  {"op": "calls", "calls": [{"name", "arguments"}...]}
                                     -> {"outcomes": [...]}, the calls made concurrently
  {"op": "wait_list_changed"}        -> {"changed": true} once notifications/tools/list_changed
                                        arrived (since the last such wait)
  {"op": "asked"}                    -> {"sampling": [prompt...], "elicitations": [message...]}

A call's outcome is {"texts": [...], "structured": ..., "is_error": bool, "progress":
[[progress, total]...], "ms": elapsed} or, for a JSON-RPC error, {"error": {"code",
"message"}, "ms": elapsed}. When stdin ends, the session is closed (the SDK closes CMD's
stdin) and the driver exits 0. A failure of the driver itself is one line {"fatal": reason}.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

STEP_TIMEOUT = 60.0  # seconds; bounds every command
SAMPLING_MODEL = "mcpmesh-hub-model"
# What the elicitation callback fills in, for the fields a form asks for.
ELICIT_ANSWERS: dict[str, Any] = {
    "name": "Ada Hub",
    "check": True,
    "firstLine": "It was a bright cold day in April.",
    "email": "ada@example.com",
    "integer": 42,
    "number": 3.5,
    "favoriteColor": "Blue",
    "agreeToTerms": True,
}


class Client:
    def __init__(self) -> None:
        self.sampled: list[str] = []
        self.elicited: list[str] = []
        self.list_changed = anyio.Event()
        self.session: ClientSession | None = None

    async def on_sampling(self, ctx: ClientRequestContext,
                          params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        contents = [c for m in params.messages for c in (m.content if isinstance(m.content, list) else [m.content])]
        prompt = " ".join(c.text for c in contents if isinstance(c, types.TextContent))
        self.sampled.append(prompt)
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text=f"sampled<{prompt}>"),
                                         model=SAMPLING_MODEL, stop_reason="endTurn")

    async def on_elicitation(self, ctx: ClientRequestContext, params: Any) -> types.ElicitResult:
        self.elicited.append(getattr(params, "message", ""))
        wanted = (getattr(params, "requested_schema", None) or {}).get("properties", {})
        return types.ElicitResult(action="accept", content={k: v for k, v in ELICIT_ANSWERS.items() if k in wanted})

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.list_changed.set()

    async def call(self, name: str, arguments: dict[str, Any], progress: bool = False) -> dict[str, Any]:
        assert self.session is not None
        seen: list[list[float | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            seen.append([value, total])

        started = time.monotonic()
        try:
            result = await self.session.call_tool(name, arguments, progress_callback=on_progress if progress else None)
        except MCPError as exc:
            return {"error": {"code": exc.error.code, "message": exc.error.message},
                    "ms": round((time.monotonic() - started) * 1000)}
        return {
            "texts": [c.text for c in result.content if isinstance(c, types.TextContent)],
            "structured": result.structured_content,
            "is_error": bool(result.is_error),
            "progress": seen,
            "ms": round((time.monotonic() - started) * 1000),
        }

    async def step(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.session is not None
        op = command.get("op")
        if op == "list":
            tools, cursor = [], None
            while True:
                page = await self.session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                tools.extend({"name": t.name, "description": t.description} for t in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return {"tools": tools}
        if op == "call":
            return await self.call(command["name"], command.get("arguments") or {}, bool(command.get("progress")))
        if op == "calls":
            outcomes: list[dict[str, Any]] = [{} for _ in command["calls"]]

            async def one(i: int, call: dict[str, Any]) -> None:
                outcomes[i] = await self.call(call["name"], call.get("arguments") or {})

            async with anyio.create_task_group() as tg:
                for i, call in enumerate(command["calls"]):
                    tg.start_soon(one, i, call)
            return {"outcomes": outcomes}
        if op == "wait_list_changed":
            await self.list_changed.wait()
            self.list_changed = anyio.Event()
            return {"changed": True}
        if op == "asked":
            return {"sampling": self.sampled, "elicitations": self.elicited}
        return {"fatal": f"unknown op {op!r}"}


def say(answer: dict[str, Any]) -> None:
    print(json.dumps(answer, ensure_ascii=True), flush=True)


async def run(command: list[str]) -> None:
    client = Client()
    server = StdioServerParameters(command=command[0], args=command[1:])
    async with stdio_client(server) as (read_stream, write_stream):
        session = ClientSession(read_stream, write_stream, sampling_callback=client.on_sampling,
                                elicitation_callback=client.on_elicitation, message_handler=client.on_message)
        async with session:
            client.session = session
            with anyio.fail_after(STEP_TIMEOUT):
                init = await session.initialize()
            say({"ready": init.server_info.name})
            while True:
                line = await anyio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return
                with anyio.fail_after(STEP_TIMEOUT):
                    say(await client.step(json.loads(line)))


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] != ["--"] or len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        anyio.run(run, argv[1:])
    except Exception as exc:  # the hub could not be started, or a step failed or timed out
        say({"fatal": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
