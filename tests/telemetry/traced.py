"""A traced MCP client and server for tests/telemetry.rs: the official Python SDK (`mcp` 2.3.0,
which makes a span per request and carries its context in `params._meta`, SEP-414) with the
OpenTelemetry SDK sending spans over OTLP/HTTP, as a user's own instrumented software would.

    traced.py server --otlp URL            an MCP server on stdio: tools echo(text) and fail()
    traced.py client --otlp URL -- CMD...  spawns CMD (e.g. `mcpmesh connect alice/svc`), calls
                                           echo, fail and an unknown tool inside a span of its
                                           own, and prints one JSON line {"trace_id": ...}

URL is the collector's base URL (spans go to URL/v1/traces). Spans are sent as each ends
(SimpleSpanProcessor), so they have reached the collector by the time an answer is written
(server) or the process exits (client). No network beyond URL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def tracing(otlp: str, name: str):
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    exporter = OTLPSpanExporter(endpoint=otlp.rstrip("/") + "/v1/traces", timeout=10)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def server() -> None:
    from mcp.server.mcpserver import MCPServer

    mcp = MCPServer("traced", version="1.0.0", log_level="WARNING")

    @mcp.tool(description="Return the given text unchanged.")
    def echo(text: str) -> str:
        return text

    @mcp.tool(description="Always fails (a tool error).")
    def fail() -> str:
        raise ValueError("this tool always fails")

    mcp.run("stdio")


async def client(cmd: list[str]) -> dict:
    import anyio
    from opentelemetry import trace

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
    tracer = trace.get_tracer("traced-client")
    with anyio.fail_after(60):
        async with Client(stdio_client(params), mode="legacy", cache=None) as c:
            with tracer.start_as_current_span("agent turn") as turn:
                echoed = await c.call_tool("echo", {"text": "traced"})
                failed = await c.call_tool("fail", {})
                try:
                    await c.call_tool("no_such_tool", {})
                    unknown = "answered"
                except Exception as e:  # noqa: BLE001 - the error is what is reported
                    unknown = type(e).__name__
                trace_id = format(turn.get_span_context().trace_id, "032x")
    return {
        "trace_id": trace_id,
        "echo": echoed.content[0].text if echoed.content else None,
        "fail_is_error": failed.is_error,
        "unknown": unknown,
    }


def main() -> None:
    argv = sys.argv[1:]
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--otlp", required=True)
    args = ap.parse_args(argv[: len(argv) - len(cmd) - (1 if cmd else 0)])
    args.cmd = cmd
    provider = tracing(args.otlp, f"python-{args.role}")
    if args.role == "server":
        server()
        return
    import anyio

    report = anyio.run(client, args.cmd)
    provider.shutdown()
    print(json.dumps(report), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
