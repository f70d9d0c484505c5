"""A client of the Skills extension (SEP-2640) for the mcpmesh tests: FastMCP's own client
(PyPI `fastmcp-slim[client]`, pinned in requirements.txt), which the official SDK's client
underlies at 2026-07-28.

Usage:
    python skills_client.py [--unknown URI] -- CMD [ARGS...]
    python skills_client.py [--unknown URI] [--header NAME=VALUE]... --url URL

Connects over stdio to CMD (or over Streamable HTTP to URL, each --header sent on every
request) with `SkillsClientExtension` declared, then:

    skills/list   every page (FastMCP's `list_skills`);
    skills/get    each listed skill by its URI;
    read_skill    each listed skill: every file of its manifest read with resources/read and
                  checked against the manifest's size and SHA-256 digest, the SKILL.md's
                  frontmatter against the entry's, the name against the URI (FastMCP's checks);
    --unknown URI skills/get of URI, which must be refused.

Prints one JSON line:

    {"protocol": "2026-07-28", "skills": [{"uri", "name", "origin" (the entry's
     _meta["mcpmesh/origin"], or null), "files": [uri, ...], "get_same": bool,
     "read": {"files": [path, ...]} | {"error": "..."}}, ...],
     "unknown": {"code": N, "message": "..."} | null}

Exit status 0 when it got that far (what the checks found is in the line); every wait is
bounded (60 s in all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from fastmcp.skills import SkillsClientExtension
from mcp.shared.exceptions import MCPError

TIMEOUT = 60


async def run(options: argparse.Namespace) -> dict:
    if options.url:
        headers = dict(h.split("=", 1) for h in options.header)
        transport = StreamableHttpTransport(options.url, headers=headers)
    else:
        transport = StdioTransport(options.command[0], options.command[1:])
    report: dict = {"protocol": None, "skills": [], "unknown": None}
    async with Client(transport, extensions=[SkillsClientExtension()]) as client:
        report["protocol"] = client.protocol_version
        for entry in await client.list_skills():
            meta = entry.meta or {}
            files = entry.resources if isinstance(entry.resources, list) else []
            got = await client.get_skill(entry.uri)
            shown = {
                "uri": entry.uri,
                "name": entry.frontmatter.root.get("name"),
                "origin": meta.get("mcpmesh/origin"),
                "files": [f.uri for f in files],
                "get_same": got.model_dump(by_alias=True) == entry.model_dump(by_alias=True),
            }
            try:
                skill = await client.read_skill(entry.uri)
                shown["read"] = {"files": sorted(skill.files)}
            except (ValueError, MCPError) as e:
                shown["read"] = {"error": str(e)}
            report["skills"].append(shown)
        if options.unknown:
            try:
                await client.get_skill(options.unknown)
            except MCPError as e:
                report["unknown"] = {"code": e.error.code, "message": e.error.message}
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--unknown")
    parser.add_argument("command", nargs="*")
    options = parser.parse_args()
    if bool(options.url) == bool(options.command):
        parser.error("give either --url URL or -- CMD [ARGS...]")
    report = asyncio.run(asyncio.wait_for(run(options), TIMEOUT))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    sys.exit(main())
