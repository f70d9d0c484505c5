"""A FastMCP server (PyPI `fastmcp-slim` with `fastmcp-tasks` 4.1, pinned in requirements.txt)
that runs tools as tasks with the tasks extension of the 2026-07-28 revision (SEP-2663,
`io.modelcontextprotocol/tasks`), on stdio.

Usage:
    python tasks_server.py

Tools:
    crunch(seconds)  task=True: sleeps `seconds`, then answers "crunched <seconds>"
    stall()          task=True: sleeps an hour (a task to cancel)
    echo(text)       an ordinary tool

The tasks extension is FastMCP's own `TasksExtension` on its in-process backend
(`memory://`): a task lives as long as this process, which is one mesh session. Nothing else
is written here: how a call becomes a task and how `tasks/get`, `tasks/update` and
`tasks/cancel` answer is FastMCP's.
"""

from __future__ import annotations

import asyncio

from fastmcp import FastMCP
from fastmcp_tasks import TasksExtension


def main() -> None:
    server = FastMCP("mcpmesh-interop-tasks")
    server.add_extension(TasksExtension(url="memory://"))

    @server.tool(task=True)
    async def crunch(seconds: float) -> str:
        """Work for `seconds`, as a task."""
        await asyncio.sleep(seconds)
        return f"crunched {seconds}"

    @server.tool(task=True)
    async def stall() -> str:
        """Work for an hour, as a task."""
        await asyncio.sleep(3600)
        return "stalled"

    @server.tool
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    server.run("stdio", show_banner=False)


if __name__ == "__main__":
    main()
