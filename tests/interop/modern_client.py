"""Interop MCP client for the mcpmesh tests (official Python SDK, `mcp` 2.3.0).

Usage:
    python modern_client.py [--era modern|legacy] [--transcript FILE] [--resource-uri URI] [--name-prefix P] [--big BYTES] -- CMD [ARGS...]
    python modern_client.py [--era modern|legacy] [--big BYTES] [--header NAME=VALUE]... --url URL

Spawns CMD with the SDK's stdio client (`mcp.Client(StdioServerParameters(...))`) and runs a
fixed set of checks against the tools/resource/prompt of tests/interop/modern_server.py:

    connect, first-frame, tools/list, echo, add, whoami, confirm (multi-round-trip),
    resources/read, prompts/get, ping (legacy era only: `ping` does not exist at 2026-07-28),
    big (only with --big).

--url URL: instead of spawning a command, connect to the Streamable HTTP endpoint URL (e.g.
tests/interop/http_server.py's http://127.0.0.1:PORT/mcp) with the SDK's
`mcp.client.streamable_http.streamable_http_client`, same checks, both eras. The SDK client's
SSE event cap (1 MiB by default) is lifted (`max_sse_event_size=None`) so a big answer streamed
as one SSE event is accepted. Cannot be combined with --transcript (that relay is stdio-only).
Over HTTP a modern (2026-07-28) request is one POST carrying MCP-Protocol-Version, Mcp-Method and
(tools/call, prompts/get, resources/read) Mcp-Name headers, no session; a legacy session is
`initialize` -> Mcp-Session-Id, a GET stream after `notifications/initialized`, DELETE at the end.
Each --header NAME=VALUE (repeatable, --url only) is sent on every HTTP request, e.g.
`Authorization=Bearer <token>` for `mcpmesh gateway`.

--resource-uri URI: read URI in the resources/read check instead of RESOURCE_URI (through
`mcpmesh hub`, the server's resource is presented as mcpmesh-hub://PEER/SERVICE/<its URI>).
--name-prefix P: the server's tools and prompt are named P<name> (a hub's PEER__SERVICE__).

--big BYTES: one more check at the end: echo a payload of exactly BYTES UTF-8 bytes of awkward
text (2/3/4-byte characters, combining marks, U+2028/U+2029, quotes, backslashes, control
characters including NUL) through the `echo` tool and require it back unchanged; reported as
`ok   big <BYTES> bytes echoed intact`. That check gets its own, longer time budget
(BIG_TIMEOUT), added to the overall one.

Prints one line per check, `ok   <name> <detail>` or `FAIL <name>: <reason>`, then a final
JSON line {"passed": N, "failed": M}. Exit status 0 only if every check passed. Every wait is
bounded (anyio.fail_after), and the SDK's stdio shutdown is itself bounded (close stdin, 2 s
grace, SIGTERM to the process group, SIGKILL 2 s later).

Eras:
  --era modern (default): MCP 2026-07-28, stateless. `Client(mode="auto")` probes
      `server/discover` first (no `initialize`, no `notifications/initialized`, ever); every
      request carries the protocol fields in `params._meta`:
        io.modelcontextprotocol/protocolVersion = "2026-07-28"
        io.modelcontextprotocol/clientInfo      = {"name": "mcp", "version": ...}
        io.modelcontextprotocol/clientCapabilities = {"elicitation": {"form": {}, "url": {}}}
      The connect check fails if the SDK fell back to the handshake.
  --era legacy: `Client(mode="legacy")`: `initialize` at 2025-11-25, then
      `notifications/initialized`.

Wire order of a modern session, verified by tracing the pipe
(`sh -c 'tee /tmp/in.log | python modern_server.py | tee /tmp/out.log'`) and by --transcript:
  client -> server (ids count from 1):
    1. server/discover          id 1, `_meta` envelope at 2026-07-28 (never `initialize`)
    2. tools/list               id 2
    3. tools/call  echo         id 3
    4. tools/call  add          id 4
    5. tools/call  whoami       id 5
    6. tools/call  confirm      id 6  -> answered {"inputRequests": {"__main__:ask": {"method":
                                          "elicitation/create", "params": {...}}},
                                          "requestState": "v1.<sealed>", "resultType": "input_required"}
    7. tools/call  confirm      id 7  the retry: same name/arguments plus "inputResponses":
                                          {"__main__:ask": {"action": "accept", "content": {...}}}
                                          and the byte-exact "requestState"
    8. resources/read           id 8
    9. prompts/get              id 9
  Every modern request's params carry `_meta` {io.modelcontextprotocol/protocolVersion,
  io.modelcontextprotocol/clientInfo, io.modelcontextprotocol/clientCapabilities}; the server
  rejects a request lacking any of the three (-32602).
  server -> client: exactly one response per request, in order, each `resultType`-tagged and
  `_meta`-stamped with serverInfo; no server-initiated requests (2026-07-28 forbids them; the
  elicitation rides inside the input_required result).
  A legacy session instead sends `initialize` (id 1), `notifications/initialized`, tools/list
  (id 2), ...; during the confirm call (id 6) the server sends a standalone
  `elicitation/create` request (server id 1) which the client answers before the id 6 result.

Transcript: `--transcript FILE` wraps CMD in a tiny byte-level relay (this same file, run with
the internal `--relay FILE` flag) that copies stdin/stdout verbatim and appends every line to
FILE as `> <line>` (client -> server) or `< <line>` (server -> client). The lines are the exact
bytes on the pipe. Equivalent by hand: put `sh -c 'tee in.log | CMD | tee out.log'` in front.
The relay also works standalone, e.g. as the *remote* service command of a mesh test, to record
exactly what arrived at the server after crossing the mesh:
    python modern_client.py --relay FILE -- python modern_server.py

The child gets this process's full environment (the SDK default would pass only
HOME/LOGNAME/PATH/SHELL/TERM/USER), so MCPMESH_* and config variables reach `mcpmesh connect`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

TOTAL_TIMEOUT = 60.0
STEP_TIMEOUT = 15.0
BIG_TIMEOUT = 120.0  # the --big check only (a 4 MiB payload is ~5 MB of escaped JSON each way)

MODERN_VERSION = "2026-07-28"
LEGACY_VERSION = "2025-11-25"

ECHO_TEXT = "hello mesh \u00e9\u00e8 \u2603 \U0001f310 \"quoted\" \\ back"
CONFIRM_QUESTION = "deploy to prod?"
CONFIRM_ANSWER = "yes, go"
RESOURCE_URI = "mcpmesh://interop/hello"
RESOURCE_URI_READ = RESOURCE_URI  # --resource-uri
NAME_PREFIX = ""  # --name-prefix
RESOURCE_TEXT = "hello from mcpmesh interop"
PROMPT_NAME = "greet"
EXPECTED_TOOLS = {"echo", "add", "whoami", "confirm"}
# One cycle of the --big payload: 1-, 2-, 3- and 4-byte UTF-8, combining marks (e + U+0301,
# a + U+0308, a ZWJ emoji sequence, a flag pair), U+2028/U+2029 (legal in JSON, line terminators
# in JavaScript), U+0085/U+FEFF/U+FFFD, quotes, backslashes and escape look-alikes, and control
# characters (NUL, \x01, \x1f, DEL, \t, \n, \r).
BIG_UNIT = (
    "\u00e9\u4e2d\U0001f600e\u0301a\u0308\u00f1\u2028\u2029\"\\/\u0001\t\n\r\u0000\u001f\u007f"
    "\u0085\ufeff\ufffd\U0001d11e \\u0041 \\\" '<>&{}[]:, \U0001f1fa\U0001f1f3 "
    "\U0001f469\u200d\U0001f4bb \u03a9\u2248\u00e7\u221a\u222b \u01c4\u01c5 \ufb01 \U0010fffd end\\"
)


# --------------------------------------------------------------------------- relay (--transcript)


def relay_main(transcript: str, cmd: list[str]) -> int:
    """Byte-verbatim stdin/stdout relay around `cmd`, logging each line to `transcript`."""
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None
    lock = threading.Lock()
    log = open(transcript, "ab")

    def record(prefix: bytes, line: bytes) -> None:
        with lock:
            log.write(prefix + line + (b"" if line.endswith(b"\n") else b"\n"))
            log.flush()

    def pump(src: Any, dst: Any, prefix: bytes) -> None:
        try:
            for line in iter(src.readline, b""):
                record(prefix, line)
                dst.write(line)
                dst.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass
        finally:
            try:
                dst.close()
            except OSError:
                pass

    up = threading.Thread(target=pump, args=(sys.stdin.buffer, child.stdin, b"> "), daemon=True)
    down = threading.Thread(target=pump, args=(child.stdout, sys.stdout.buffer, b"< "), daemon=True)
    up.start()
    down.start()
    rc = child.wait()
    down.join(timeout=2)
    log.close()
    return rc


# --------------------------------------------------------------------------- client


def big_payload(size: int) -> str:
    """Exactly `size` UTF-8 bytes of BIG_UNIT repeated (cut at a character boundary, "." padded).

    With INTEROP_BIG_MOSTLY_ASCII set, each BIG_UNIT is followed by 16 KiB of ASCII: for servers
    whose answers escape every non-ASCII character (the SDK's Streamable HTTP server writes
    `\\uXXXX` and returns the text twice), so the answer stays under the mesh's 16 MiB frame cap.
    """
    unit = BIG_UNIT.encode("utf-8")
    if os.environ.get("INTEROP_BIG_MOSTLY_ASCII"):
        unit += b"abcdefghijklmnop" * 1024
    raw = (unit * (size // len(unit) + 1))[:size]
    text = raw.decode("utf-8", errors="ignore")  # drops only a character cut in half at the end
    text += "." * (size - len(text.encode("utf-8")))
    assert len(text.encode("utf-8")) == size
    return text


class Tap:
    """Observes the JSON-RPC messages crossing the SDK's stdio streams (parsed form)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []

    @staticmethod
    def dump(item: Any) -> dict[str, Any] | None:
        from mcp.shared.message import SessionMessage

        if isinstance(item, SessionMessage):
            return item.message.model_dump(by_alias=True, mode="json", exclude_unset=True)
        return None

    def transport(self, inner: Any) -> Any:
        from contextlib import asynccontextmanager

        tap = self

        class TapRead:
            def __init__(self, s: Any) -> None:
                self._s = s

            async def receive(self) -> Any:
                item = await self._s.receive()
                if (d := tap.dump(item)) is not None:
                    tap.received.append(d)
                return item

            async def aclose(self) -> None:
                await self._s.aclose()

            def __aiter__(self) -> TapRead:
                return self

            async def __anext__(self) -> Any:
                import anyio

                try:
                    return await self.receive()
                except anyio.EndOfStream:
                    raise StopAsyncIteration from None

            async def __aenter__(self) -> TapRead:
                return self

            async def __aexit__(self, *exc: Any) -> None:
                await self.aclose()

        class TapWrite:
            def __init__(self, s: Any) -> None:
                self._s = s

            async def send(self, item: Any) -> None:
                if (d := tap.dump(item)) is not None:
                    tap.sent.append(d)
                await self._s.send(item)

            async def aclose(self) -> None:
                await self._s.aclose()

            async def __aenter__(self) -> TapWrite:
                return self

            async def __aexit__(self, *exc: Any) -> None:
                await self.aclose()

        @asynccontextmanager
        async def wrapped() -> Any:
            async with inner as (read_stream, write_stream):
                yield TapRead(read_stream), TapWrite(write_stream)

        return wrapped()

    def requests_sent(self, method: str, tool: str | None = None) -> list[dict[str, Any]]:
        return [
            m
            for m in self.sent
            if m.get("method") == method
            and "id" in m
            and (tool is None or (m.get("params") or {}).get("name") == tool)
        ]

    def response_to(self, request_id: Any) -> dict[str, Any] | None:
        for m in self.received:
            if "method" not in m and m.get("id") == request_id:
                return m
        return None


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def ok(self, name: str, detail: str = "") -> None:
        self.passed += 1
        print(f"ok   {name} {detail}".rstrip(), flush=True)

    def fail(self, name: str, reason: str) -> None:
        self.failed += 1
        print(f"FAIL {name}: {reason}".replace("\n", " "), flush=True)


def describe(exc: BaseException) -> str:
    """One-line description, unwrapping the task-group ExceptionGroups the SDK raises."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def text_of(result: Any) -> str:
    from mcp_types import TextContent

    return "".join(c.text for c in result.content if isinstance(c, TextContent))


async def run_checks(
    era: str,
    cmd: list[str],
    transcript: str | None,
    report: Report,
    url: str | None = None,
    big: int | None = None,
    headers: dict[str, str] | None = None,
) -> None:
    import contextlib

    import anyio
    import mcp_types as types
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    http_client = None
    if url is not None:
        from mcp.client.streamable_http import streamable_http_client

        # Without headers, no http_client: the SDK makes its default one (create_mcp_http_client:
        # 30 s timeouts, 300 s read) and closes it; with them, the same kind of client, closed
        # here. terminate_on_close (default) sends the DELETE of a session.
        if headers:
            from mcp.shared._httpx_utils import create_mcp_http_client

            http_client = create_mcp_http_client(headers=headers)
        inner = streamable_http_client(url, http_client=http_client, max_sse_event_size=None)
    else:
        if transcript is not None:
            cmd = [sys.executable, os.path.abspath(__file__), "--relay", transcript, "--", *cmd]
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
        inner = stdio_client(params)
    tap = Tap()
    elicitations: list[types.ElicitRequestParams] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        elicitations.append(params)
        return types.ElicitResult(action="accept", content={"answer": CONFIRM_ANSWER})

    client = Client(
        tap.transport(inner),
        mode="auto" if era == "modern" else "legacy",
        elicitation_callback=on_elicit,
        read_timeout_seconds=STEP_TIMEOUT,
        cache=None,  # every check must reach the wire
    )

    async def step(name: str, fn: Any, timeout: float = STEP_TIMEOUT) -> None:
        try:
            with anyio.fail_after(timeout):
                detail = await fn()
            report.ok(name, detail or "")
        except AssertionError as e:
            report.fail(name, str(e) or "assertion failed")
        except TimeoutError:
            report.fail(name, f"timed out after {timeout}s")
        except Exception as e:  # noqa: BLE001 - every failure is a reported check
            report.fail(name, describe(e))

    # `Client.__aenter__` opens the stdio transport's task group, so it cannot sit inside a cancel
    # scope of its own (anyio scope nesting); the connect is bounded by the caller's overall
    # fail_after plus the SDK's own timeouts (discover: 10 s, initialize: read_timeout_seconds).
    connected = False
    own_client = http_client if http_client is not None else contextlib.nullcontext()
    try:
        async with own_client, client:
            connected = True
            await session_checks(era, client, tap, elicitations, step)
            if big is not None:
                await big_check(client, big, step)
    except Exception as e:  # noqa: BLE001 - connect or teardown failure
        report.fail("connect" if not connected else "teardown", describe(e))


async def session_checks(era: str, client: Any, tap: Tap, elicitations: list[Any], step: Any) -> None:
    import mcp_types as types

    async def connect() -> str:
        session = client.session
        version = client.protocol_version
        if era == "modern":
            assert version == MODERN_VERSION, f"negotiated {version!r}, wanted {MODERN_VERSION} (fell back?)"
            dr = session.discover_result
            assert dr is not None and session.initialize_result is None, "no DiscoverResult adopted"
            assert MODERN_VERSION in dr.supported_versions, f"supportedVersions {dr.supported_versions}"
            name = client.server_info.name if client.server_info else None
            return f"discover version={version} supported={dr.supported_versions} server={name}"
        assert version == LEGACY_VERSION, f"negotiated {version!r}, wanted {LEGACY_VERSION}"
        ir = session.initialize_result
        assert ir is not None and session.discover_result is None, "no InitializeResult"
        return f"initialize version={version} server={ir.server_info.name}"

    await step("connect", connect)

    async def first_frame() -> str:
        methods = [m.get("method") for m in tap.sent if "method" in m]
        assert methods, "nothing sent"
        if era == "modern":
            assert methods[0] == "server/discover", f"first frame was {methods[0]!r}"
            assert "initialize" not in methods, "sent initialize on a modern session"
            meta = (tap.sent[0].get("params") or {}).get("_meta") or {}
            pv = meta.get("io.modelcontextprotocol/protocolVersion")
            assert pv == MODERN_VERSION, f"discover _meta protocolVersion={pv!r}"
        else:
            assert methods[0] == "initialize", f"first frame was {methods[0]!r}"
            pv = (tap.sent[0].get("params") or {}).get("protocolVersion")
            assert pv == LEGACY_VERSION, f"initialize protocolVersion={pv!r}"
        return " ".join(str(m) for m in methods)

    await step("first-frame", first_frame)

    async def list_tools() -> str:
        names = {t.name.removeprefix(NAME_PREFIX) for t in (await client.list_tools()).tools}
        assert EXPECTED_TOOLS <= names, f"missing tools {sorted(EXPECTED_TOOLS - names)}"
        return ",".join(sorted(names))

    await step("tools/list", list_tools)

    async def echo() -> str:
        r = await client.call_tool(NAME_PREFIX + "echo", {"text": ECHO_TEXT})
        assert not r.is_error, f"isError: {text_of(r)}"
        assert text_of(r) == ECHO_TEXT, f"got {text_of(r)!r}"
        return json.dumps(text_of(r))

    await step("echo", echo)

    async def add() -> str:
        r = await client.call_tool(NAME_PREFIX + "add", {"a": 2, "b": 40})
        assert not r.is_error, f"isError: {text_of(r)}"
        assert text_of(r) == "42", f"got {text_of(r)!r}"
        assert r.structured_content == {"result": 42}, f"structured {r.structured_content!r}"
        return "2+40=42"

    await step("add", add)

    async def whoami() -> str:
        r = await client.call_tool(NAME_PREFIX + "whoami", {})
        assert not r.is_error, f"isError: {text_of(r)}"
        data = json.loads(text_of(r))
        for key in ("MCPMESH_PEER_EID", "MCPMESH_PEER_NAME", "MCPMESH_SERVICE", "meta_peer"):
            assert key in data, f"missing {key}"
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    await step("whoami", whoami)

    async def confirm() -> str:
        r = await client.call_tool(NAME_PREFIX + "confirm", {"question": CONFIRM_QUESTION})
        assert not r.is_error, f"isError: {text_of(r)}"
        want = f"{CONFIRM_QUESTION} -> {CONFIRM_ANSWER}"
        assert text_of(r) == want, f"got {text_of(r)!r}, wanted {want!r}"
        assert len(elicitations) == 1, f"elicitation callback ran {len(elicitations)} times"
        calls = tap.requests_sent("tools/call", NAME_PREFIX + "confirm")
        if era == "modern":
            assert len(calls) == 2, f"{len(calls)} tools/call confirm frames sent, wanted 2 (call + retry)"
            first = tap.response_to(calls[0]["id"])
            assert first is not None and "result" in first, f"first round answered {first!r}"
            res = first["result"]
            assert res.get("resultType") == "input_required", f"first round resultType={res.get('resultType')!r}"
            keys = list((res.get("inputRequests") or {}).keys())
            methods = [v.get("method") for v in (res.get("inputRequests") or {}).values()]
            assert methods == ["elicitation/create"], f"inputRequests methods {methods}"
            state = res.get("requestState")
            assert isinstance(state, str) and state, "no requestState"
            retry = calls[1].get("params") or {}
            assert retry.get("requestState") == state, "retry did not echo requestState byte-exact"
            answers = retry.get("inputResponses") or {}
            assert list(answers.keys()) == keys, f"retry inputResponses keys {list(answers)} != {keys}"
            assert not any(m.get("method") == "elicitation/create" and "id" in m for m in tap.received), (
                "server sent a standalone elicitation/create request on a modern session"
            )
            second = tap.response_to(calls[1]["id"])
            rt = (second or {}).get("result", {}).get("resultType")
            assert rt == "complete", f"retry resultType={rt!r}"
            return f"input_required -> elicitation -> retry -> {json.dumps(text_of(r))} (rounds=2)"
        assert len(calls) == 1, f"{len(calls)} tools/call confirm frames sent, wanted 1"
        server_reqs = [m for m in tap.received if m.get("method") == "elicitation/create" and "id" in m]
        assert len(server_reqs) == 1, f"{len(server_reqs)} elicitation/create requests from the server"
        return f"elicitation/create mid-call -> {json.dumps(text_of(r))}"

    await step("confirm", confirm)

    async def read_resource() -> str:
        r = await client.read_resource(RESOURCE_URI_READ)
        texts = [c.text for c in r.contents if isinstance(c, types.TextResourceContents)]
        assert texts == [RESOURCE_TEXT], f"got {texts!r}"
        return f"{RESOURCE_URI_READ} {json.dumps(texts[0])}"

    await step("resources/read", read_resource)

    async def get_prompt() -> str:
        r = await client.get_prompt(NAME_PREFIX + PROMPT_NAME, {"name": "mesh"})
        assert len(r.messages) == 1, f"{len(r.messages)} messages"
        content = r.messages[0].content
        assert isinstance(content, types.TextContent), f"content {type(content).__name__}"
        assert content.text == "Please greet mesh.", f"got {content.text!r}"
        return f"{PROMPT_NAME} {json.dumps(content.text)}"

    await step("prompts/get", get_prompt)

    if era == "legacy":  # `ping` was removed in 2026-07-28

        async def ping() -> str:
            await client.session.send_ping()
            return ""

        await step("ping", ping)


async def big_check(client: Any, size: int, step: Any) -> None:
    payload = big_payload(size)

    async def big() -> str:
        r = await client.call_tool(NAME_PREFIX + "echo", {"text": payload}, read_timeout_seconds=BIG_TIMEOUT)
        assert not r.is_error, f"isError: {text_of(r)[:200]}"
        got = text_of(r)
        if got != payload:
            at = next((i for i, (a, b) in enumerate(zip(got, payload)) if a != b), min(len(got), len(payload)))
            raise AssertionError(
                f"echo differs at char {at}: got {len(got.encode('utf-8', 'surrogatepass'))} bytes "
                f"({len(got)} chars), sent {size} bytes ({len(payload)} chars); "
                f"got {got[at:at + 12]!r}, sent {payload[at:at + 12]!r}"
            )
        return f"{size} bytes echoed intact"

    await step("big", big, BIG_TIMEOUT)


def parse_args(
    argv: list[str],
) -> tuple[str, str | None, list[str], str | None, int | None, dict[str, str]]:
    usage = (
        "usage: modern_client.py [--era modern|legacy] [--transcript FILE] [--resource-uri URI] [--name-prefix P] [--big BYTES] -- CMD [ARGS...]\n"
        "       modern_client.py [--era modern|legacy] [--big BYTES] [--header NAME=VALUE]... --url URL"
    )
    if "--" in argv:
        split = argv.index("--")
        opts, cmd = argv[:split], argv[split + 1 :]
    else:
        opts, cmd = argv, []
    era, transcript, url, big = "modern", None, None, None
    headers: dict[str, str] = {}
    i = 0
    while i < len(opts):
        if opts[i] == "--era" and i + 1 < len(opts) and opts[i + 1] in ("modern", "legacy"):
            era = opts[i + 1]
        elif opts[i] == "--transcript" and i + 1 < len(opts):
            transcript = opts[i + 1]
        elif opts[i] == "--url" and i + 1 < len(opts):
            url = opts[i + 1]
        elif opts[i] == "--header" and i + 1 < len(opts) and "=" in opts[i + 1]:
            name, _, value = opts[i + 1].partition("=")
            if not name.strip():
                sys.exit(usage)
            headers[name.strip()] = value
        elif opts[i] == "--resource-uri" and i + 1 < len(opts):
            global RESOURCE_URI_READ
            RESOURCE_URI_READ = opts[i + 1]
        elif opts[i] == "--name-prefix" and i + 1 < len(opts):
            global NAME_PREFIX
            NAME_PREFIX = opts[i + 1]
        elif opts[i] == "--big" and i + 1 < len(opts) and opts[i + 1].isdigit() and int(opts[i + 1]) > 0:
            big = int(opts[i + 1])
        else:
            sys.exit(usage)
        i += 2
    if url is not None:
        if "--" in argv or transcript is not None:
            sys.exit(usage)  # --url replaces the command, and the transcript relay is stdio-only
    elif "--" not in argv or not cmd or headers:
        sys.exit(usage)  # headers are for --url
    return era, transcript, cmd, url, big, headers


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--relay"] and len(argv) >= 4 and argv[2] == "--":
        return relay_main(argv[1], argv[3:])
    era, transcript, cmd, url, big, headers = parse_args(argv)

    import anyio

    report = Report()
    total = TOTAL_TIMEOUT if big is None else TOTAL_TIMEOUT + BIG_TIMEOUT

    async def run() -> None:
        try:
            with anyio.fail_after(total):
                await run_checks(era, cmd, transcript, report, url, big, headers)
        except TimeoutError:
            report.fail("session", f"overall timeout {total}s")

    anyio.run(run)
    print(json.dumps({"passed": report.passed, "failed": report.failed}), flush=True)
    return 0 if report.failed == 0 and report.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
