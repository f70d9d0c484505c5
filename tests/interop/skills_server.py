"""A FastMCP server (PyPI `fastmcp-slim`, pinned in requirements.txt) that serves Agent Skills
over MCP with the Skills extension (SEP-2640, `io.modelcontextprotocol/skills`), on stdio.

Usage:
    python skills_server.py ROOT

Every folder below ROOT holding a `SKILL.md` is a skill, served by FastMCP's own
`SkillsDirectoryProvider` at `skill://<path below ROOT>/SKILL.md`, with `skills/list`,
`skills/get` and each file as a resource. One tool, `echo` (title "Echo", one icon), so the
server is an ordinary one besides; the server has an icon and a website too (ICON, WEBSITE),
so what the hub keeps of a server's and a tool's metadata can be seen. Nothing else is written
here: what is served and how is FastMCP's.
"""

from __future__ import annotations

import sys

import mcp_types
from fastmcp import FastMCP
from fastmcp.server.providers.skills import SkillsDirectoryProvider
from fastmcp.skills.extension import SkillsExtension


ICON = "data:image/svg+xml;base64,PHN2ZyB4bWxucz0iaHR0cDovL3d3dy53My5vcmcvMjAwMC9zdmciLz4="
WEBSITE = "https://example.org/mcpmesh-interop-skills"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: skills_server.py ROOT")
    icon = mcp_types.Icon(src=ICON, mime_type="image/svg+xml")
    server = FastMCP("mcpmesh-interop-skills", icons=[icon], website_url=WEBSITE)

    @server.tool(title="Echo", icons=[icon])
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    # FastMCP 4.1 serves the extension's discovery, strict manifests and byte-preserving
    # reads behind `experimental_skills`, and the extension itself once added.
    skills = SkillsDirectoryProvider(sys.argv[1], experimental_skills=True)
    server.add_provider(skills)
    server.add_extension(SkillsExtension(providers=[skills]))
    server.run("stdio", show_banner=False)


if __name__ == "__main__":
    main()
