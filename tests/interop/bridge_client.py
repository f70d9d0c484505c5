"""The official MCP Python SDK (`mcp` 2.3.0) as a 2026-07-28 client calling tools that make
its server ask the client something (elicitation, sampling): `Client(mode="auto")`, whose
`call_tool` answers an `input_required` result through its callbacks and retries by itself.

Usage: bridge_client.py TOOL[=JSON_ARGUMENTS]... -- CMD [ARGS...]
       bridge_client.py [--header NAME=VALUE]... --url URL TOOL[=JSON_ARGUMENTS]...

CMD is started as a stdio MCP server; with --url, the Streamable HTTP endpoint URL is used
instead (each --header sent on every request, e.g. `Authorization=Bearer <token>`). After connecting (it must negotiate 2026-07-28), each
TOOL is called in turn; the output is one JSON line per call, {"tool", "texts", "is_error"},
then {"era": version, "elicited": [messages], "sampled": [prompts]}. Exit status 0 when every
call answered. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

TIMEOUT = 60.0
FORM = {
    "name": "Ada Bridge",
    "check": True,
    "firstLine": "It was a bright cold day.",
    "email": "ada@example.com",
    "integer": 42,
    "number": 3.5,
    "favoriteColor": "Blue",
    "agreeToTerms": True,
}


async def run(
    calls: list[tuple[str, dict[str, Any]]], cmd: list[str], url: str | None, headers: dict[str, str]
) -> int:
    import mcp_types as types
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    elicited: list[str] = []
    sampled: list[str] = []

    async def on_elicit(context: Any, params: Any) -> Any:
        elicited.append(getattr(params, "message", ""))
        return types.ElicitResult(action="accept", content=FORM)

    async def on_sample(context: Any, params: Any) -> Any:
        prompt = " ".join(
            getattr(m.content, "text", "") for m in params.messages if hasattr(m, "content")
        )
        sampled.append(prompt)
        return types.CreateMessageResult(
            role="assistant",
            model="bridge-model",
            content=types.TextContent(type="text", text="forty-two"),
        )

    if url is not None:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
    else:
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
        transport = stdio_client(params)
    client = Client(
        transport,
        mode="auto",
        elicitation_callback=on_elicit,
        sampling_callback=on_sample,
        read_timeout_seconds=TIMEOUT,
        cache=None,
    )
    async with client:
        for name, arguments in calls:
            with anyio.fail_after(TIMEOUT):
                result = await client.call_tool(name, arguments)
            texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
            print(json.dumps({"tool": name, "texts": texts, "is_error": bool(result.is_error)}), flush=True)
        print(
            json.dumps({"era": client.protocol_version, "elicited": elicited, "sampled": sampled}),
            flush=True,
        )
    return 0


def main() -> int:
    argv = sys.argv[1:]
    url, headers, cmd = None, {}, []
    if "--" in argv:
        split = argv.index("--")
        argv, cmd = argv[:split], argv[split + 1 :]
    specs = []
    i = 0
    while i < len(argv):
        if argv[i] == "--url" and i + 1 < len(argv):
            url = argv[i + 1]
            i += 2
        elif argv[i] == "--header" and i + 1 < len(argv) and "=" in argv[i + 1]:
            name, _, value = argv[i + 1].partition("=")
            headers[name] = value
            i += 2
        else:
            specs.append(argv[i])
            i += 1
    calls = []
    for spec in specs:
        name, _, args = spec.partition("=")
        calls.append((name, json.loads(args) if args else {}))
    if not calls or (url is None) == (not cmd) or (url is not None and cmd):
        sys.exit(__doc__)
    return anyio.run(run, calls, cmd, url, headers)


if __name__ == "__main__":
    sys.exit(main())
