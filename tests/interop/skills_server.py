"""A FastMCP server (PyPI `fastmcp-slim`, pinned in requirements.txt) that serves Agent Skills
over MCP with the Skills extension (SEP-2640, `io.modelcontextprotocol/skills`), on stdio.

Usage:
    python skills_server.py ROOT

Every folder below ROOT holding a `SKILL.md` is a skill, served by FastMCP's own
`SkillsDirectoryProvider` at `skill://<path below ROOT>/SKILL.md`, with `skills/list`,
`skills/get` and each file as a resource. One tool, `echo`, so the server is an ordinary one
besides. Nothing else is written here: what is served and how is FastMCP's.
"""

from __future__ import annotations

import sys

from fastmcp import FastMCP
from fastmcp.server.providers.skills import SkillsDirectoryProvider
from fastmcp.skills.extension import SkillsExtension


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: skills_server.py ROOT")
    server = FastMCP("mcpmesh-interop-skills")

    @server.tool
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
