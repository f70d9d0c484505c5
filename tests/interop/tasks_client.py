"""A client of the tasks extension (SEP-2663) for the mcpmesh tests: FastMCP's own client with
`fastmcp-tasks` (PyPI, 4.1, pinned in requirements.txt), which declares the extension and
drives tasks through `tasks/get`, `tasks/update` and `tasks/cancel`.

Usage:
    python tasks_client.py [--prefix P] [--unknown ID] -- CMD [ARGS...]
    python tasks_client.py [--prefix P] [--unknown ID] [--header NAME=VALUE]... --url URL

Connects over stdio to CMD (or Streamable HTTP to URL) and, with the tools named P<name>:

    transparent   `call_tool(crunch, 0.5)`: the client polls the task to its result itself;
    handle        `call_tool_task(crunch, 1)`: the task id, its first status, then `result()`;
    cancel        `call_tool_task(stall)`, `cancel()`, then the status it ends in;
    plain         `call_tool(echo)`: an ordinary call;
    --unknown ID  `tasks/get` of ID, which must be refused.

Prints one JSON line:

    {"protocol", "transparent": text, "handle": {"task_id", "first", "result"},
     "cancel": {"task_id", "status"}, "plain": text, "unknown": {"code", "message"} | null}

Every wait is bounded (60 s in all).
"""

from __future__ import annotations

import argparse
import os
import sys

from fastmcp import Client
from fastmcp_tasks import call_tool_task
from fastmcp_tasks.client_models import ClientGetTaskResult, GetTaskRequest, GetTaskRequestParams
from mcp.shared.exceptions import MCPError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastmcp_drive  # noqa: E402


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def run(options: argparse.Namespace) -> dict:
    transport = fastmcp_drive.transport(options)
    name = lambda tool: f"{options.prefix}{tool}"  # noqa: E731
    report: dict = {"protocol": None, "unknown": None}
    async with Client(transport) as client:
        report["protocol"] = client.protocol_version
        report["transparent"] = text_of(await client.call_tool(name("crunch"), {"seconds": 0.5}))

        task = await call_tool_task(client, name("crunch"), {"seconds": 1})
        first = task.create_result.status
        report["handle"] = {
            "task_id": task.task_id,
            "first": first,
            "result": text_of(await task.result()),
        }

        stalled = await call_tool_task(client, name("stall"))
        await stalled.cancel()
        report["cancel"] = {"task_id": stalled.task_id, "status": (await stalled.status()).status}

        report["plain"] = text_of(await client.call_tool(name("echo"), {"text": "plainly"}))

        if options.unknown:
            try:
                await client.session.send_request(
                    GetTaskRequest(params=GetTaskRequestParams(task_id=options.unknown)),
                    ClientGetTaskResult,
                )
            except MCPError as e:
                report["unknown"] = {"code": e.error.code, "message": e.error.message}
    return report


def main() -> None:
    parser = fastmcp_drive.parser()
    parser.add_argument("--prefix", default="")
    parser.add_argument("--unknown")
    fastmcp_drive.report(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
