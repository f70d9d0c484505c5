"""What the FastMCP-driven test clients share (skills_client.py, tasks_client.py): their
command line — either `--url URL` (Streamable HTTP, each `--header NAME=VALUE` on every request)
or `-- CMD [ARGS...]` (stdio) — and the FastMCP transport it names, and running a report within
a bound and printing it as one JSON line."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable

from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

TIMEOUT = 60


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--url")
    p.add_argument("--header", action="append", default=[])
    p.add_argument("command", nargs="*")
    return p


def transport(options: argparse.Namespace):
    if bool(options.url) == bool(options.command):
        raise SystemExit("give either --url URL or -- CMD [ARGS...]")
    if options.url:
        headers = dict(h.split("=", 1) for h in options.header)
        return StreamableHttpTransport(options.url, headers=headers)
    return StdioTransport(options.command[0], options.command[1:])


def report(run: Callable[[argparse.Namespace], Awaitable[dict]], options: argparse.Namespace) -> None:
    """Runs `run(options)` within TIMEOUT seconds and prints what it returns as one line."""
    print(json.dumps(asyncio.run(asyncio.wait_for(run(options), TIMEOUT))), flush=True)
