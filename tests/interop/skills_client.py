"""A client of the Skills extension (SEP-2640) for the mcpmesh tests: FastMCP's own client
(PyPI `fastmcp-slim[client]` 4.1, pinned in requirements.txt) over the official SDK's client
at 2026-07-28.

Usage:
    python skills_client.py [--unknown URI] -- CMD [ARGS...]
    python skills_client.py [--unknown URI] [--header NAME=VALUE]... --url URL

Connects over stdio to CMD (or over Streamable HTTP to URL, each --header sent on every
request) with `SkillsClientExtension` declared, then:

    skills/list   every page (FastMCP's `list_skills`);
    skills/get    each listed skill by its URI;
    read          each listed skill as the extension has a host load it: every file of its
                  manifest read with resources/read and checked against the manifest's size
                  and SHA-256 digest, the SKILL.md's YAML frontmatter against the entry's, and
                  the name against the URI's last segment before SKILL.md (FastMCP 4.1's
                  client has no loader of its own, so these checks are written here);
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
import base64
import hashlib
import os
import sys

import mcp_types
import yaml

from fastmcp import Client
from fastmcp.skills import SkillsClientExtension
from mcp.shared.exceptions import MCPError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fastmcp_drive  # noqa: E402



async def load(client: Client, entry) -> list[str]:
    """Reads and verifies every file of `entry`'s manifest; the files' paths below the skill.
    Raises ValueError on the first file that is not what the entry says."""
    if not isinstance(entry.resources, list):
        raise ValueError("a dynamic skill has no manifest to verify")
    root = entry.uri[: -len("SKILL.md")]
    if not entry.uri.endswith("/SKILL.md") or root.rstrip("/").rsplit("/", 1)[-1] != entry.frontmatter.root.get("name"):
        raise ValueError(f"{entry.uri} does not end in its name and SKILL.md")
    paths = []
    for record in entry.resources:
        if not record.uri.startswith(root):
            raise ValueError(f"{record.uri} is outside the skill")
        contents = await client.read_resource(record.uri)
        if len(contents) != 1:
            raise ValueError(f"{record.uri}: {len(contents)} contents")
        (content,) = contents
        if isinstance(content, mcp_types.TextResourceContents):
            raw = content.text.encode("utf-8")
        else:
            raw = base64.b64decode(content.blob)
        if len(raw) != record.size:
            raise ValueError(f"{record.uri} is {len(raw)} bytes, the manifest says {record.size}")
        if f"sha256:{hashlib.sha256(raw).hexdigest()}" != record.digest:
            raise ValueError(f"{record.uri} does not match its digest")
        if record.uri == entry.uri:
            text = raw.decode("utf-8")
            _, front, _ = text.split("---", 2)
            if yaml.safe_load(front) != entry.frontmatter.root:
                raise ValueError(f"{record.uri}: its frontmatter is not the entry's")
        paths.append(record.uri[len(root):])
    return sorted(paths)


async def run(options: argparse.Namespace) -> dict:
    transport = fastmcp_drive.transport(options)
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
                shown["read"] = {"files": await load(client, entry)}
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
    parser = fastmcp_drive.parser()
    parser.add_argument("--unknown")
    fastmcp_drive.report(run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
