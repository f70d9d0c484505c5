#!/usr/bin/env python3
"""Interop driver: the official MCP Python SDK (2.x) against `server-everything`.

Usage: everything_client.py [--only NAME,...] -- CMD [ARGS...]
       everything_client.py [--only NAME,...] --url URL [--header NAME=VALUE]...

CMD is started as a stdio MCP server (handshake era, protocol 2025-11-25) and
every feature `@modelcontextprotocol/server-everything` offers is exercised
over that one connection. The driver speaks nothing but stdio MCP to CMD, so
the same run works against the server directly and against
`mcpmesh connect peer/service`, which must forward the bytes unchanged.

With --url instead of a command, the same checks run over Streamable HTTP
(the SDK's `streamable_http_client`) against the MCP endpoint URL, e.g. server-everything's
`streamableHttp` mode at http://127.0.0.1:PORT/mcp; each --header is sent on every HTTP
request. Server->client requests and notifications ride the POST response streams and the
GET stream. Two things differ from stdio, both forced by HTTP:
  * the `notifications/initialized` POST is held until the GET stream's response headers
    have arrived (bounded by GET_STREAM_WAIT), because a server may drop what it sends
    without a related request while no GET stream is open, and server-everything sends
    tools/list_changed and its first roots/list right after `initialized`;
  * big-utf8 echoes 3 MiB instead of 4 MiB (see HTTP_BIG_UTF8_BYTES), so its detail line
    names a different byte count.

Each check prints one line, `ok   <check> <detail>` or `FAIL <check>: <reason>`;
the last line is the JSON object `{"passed":N,"failed":M}` and the exit status
is 0 only if nothing failed. Details are deterministic ASCII (no ids, timestamps
or counts that vary between runs), so two runs' outputs can be compared line by
line. If CMD cannot be started at all (or URL cannot be reached), the one line is
`FAIL session: ...`.

Checks (names for --only): initialize, tools (also tool:<name> for one tool),
resources, prompts, ping, logging, progress, list-changed, server-requests,
tasks, cancellation, pipelined, big-utf8.

MCP tasks (SEP-1686, 2025-11-25): SDK 2.3 ships the task *types* but no task
runtime (tasks/* are deliberately absent from its method tables). So:
  * client -> server: tasks/get, tasks/result, tasks/list and tasks/cancel go
    through the typed `ClientSession.send_request`; the task-augmented
    `tools/call` goes through the dispatcher's raw `send_raw_request`, because
    the typed tools/call path validates the reply as a CallToolResult and would
    reject the CreateTaskResult;
  * server -> client: `TaskAwareDispatcher` wraps the `on_request` hook of the
    SDK's `JSONRPCDispatcher.run` and acts as the task receiver: it answers a
    task-augmented sampling/elicitation request with a CreateTaskResult, runs
    the SDK's normal callback path in the background, and serves
    tasks/get, tasks/result, tasks/list and tasks/cancel from its own store.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import itertools
import json
import os
import re
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp.client.extension import NotificationBinding
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.dispatcher import OnNotify, OnNotifyIntercept, OnRequest
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError, UrlElicitationRequiredError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage

# The 2025-11-25 features this driver exercises (logging/setLevel, resources/subscribe,
# roots) are deprecated as of 2026-07-28; the SDK warns on every use. Expected here.
warnings.simplefilter("ignore", MCPDeprecationWarning)

PROTOCOL_VERSION = "2025-11-25"
CHECK_TIMEOUT = 30.0  # seconds; bounds every check (and the handshake) as a whole
RELATED_TASK = "io.modelcontextprotocol/related-task"
TERMINAL_TASK_STATES = {"completed", "failed", "cancelled"}
LOG_LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
# Streamable HTTP only. The TypeScript SDK's server transport refuses a request body over
# DEFAULT_MAX_REQUEST_BODY_SIZE = 4 * 1024 * 1024 bytes (413, server/requestBody.js), and
# server-everything does not raise it; 4 MiB of escape-heavy text is about 5 MB of JSON, while
# 3 MiB is about 3.8 MB. (The answer comes back as one SSE event of that size, hence
# max_sse_event_size=None below: the SDK client's default cap is 1 MiB.)
HTTP_BIG_UTF8_BYTES = 3 * 1024 * 1024
GET_STREAM_WAIT = 10.0  # seconds the `initialized` POST waits for the GET stream to open

# What the client-side callbacks answer; the checks look for these in tool results.
SAMPLING_MODEL = "mcpmesh-interop-model"
SAMPLING_REFUSAL = "please refuse this sampling request"
ELICIT_ANSWERS: dict[str, Any] = {
    "name": "Ada Mesh",
    "check": True,
    "firstLine": "It was a bright cold day in April.",
    "email": "ada@example.com",
    "integer": 42,
    "number": 3.5,
    "favoriteColor": "Blue",
    "agreeToTerms": True,
    "interpretation": "programming",  # simulate-research-query's clarification for "python"
}
INITIAL_ROOTS = [("file:///srv/mesh/project-a", "Project A"), ("file:///srv/mesh/shared%20docs", "Shared docs")]


class CheckError(Exception):
    """A check's expectation did not hold; the message is the FAIL reason."""


def expect(condition: object, reason: str) -> None:
    if not condition:
        raise CheckError(reason)


# --------------------------------------------------------------------------------------
# Event logs: append-only records that a check can wait on without sleeping.
# --------------------------------------------------------------------------------------

_sequence = itertools.count()  # one clock for every log, so wire order can be compared across logs


@dataclass
class Entry:
    seq: int
    item: Any


class Log:
    """Append-only record plus predicate waiters (an anyio.Event per waiter)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._waiters: list[tuple[Callable[[Any], bool], anyio.Event, list[Entry]]] = []

    def add(self, item: Any) -> None:
        entry = Entry(next(_sequence), item)
        self.entries.append(entry)
        for waiter in list(self._waiters):
            predicate, event, hit = waiter
            if predicate(item):
                hit.append(entry)
                event.set()
                self._waiters.remove(waiter)

    def mark(self) -> int:
        """A position to search from, taken before triggering what is awaited."""
        return len(self.entries)

    def find(self, predicate: Callable[[Any], bool], since: int = 0) -> list[Entry]:
        return [e for e in self.entries[since:] if predicate(e.item)]

    async def wait_for(self, predicate: Callable[[Any], bool], since: int = 0) -> Entry:
        """The first entry at or after `since` matching `predicate`; callers bound it."""
        found = self.find(predicate, since)
        if found:
            return found[0]
        event, hit = anyio.Event(), []
        waiter = (predicate, event, hit)
        self._waiters.append(waiter)
        try:
            await event.wait()
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return hit[0]


# Wire taps: record every JSON-RPC message in wire order, below the SDK's dispatcher,
# so checks can assert what actually crossed the connection (and in what order).


class TapReceive:
    """Read-stream wrapper that logs each inbound JSON-RPC message."""

    def __init__(self, inner: Any, log: Log) -> None:
        self._inner, self._log = inner, log

    async def receive(self) -> SessionMessage | Exception:
        item = await self._inner.receive()
        if isinstance(item, SessionMessage):
            self._log.add(item.message)
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> TapReceive:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> TapReceive:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TapSend:
    """Write-stream wrapper that logs each outbound JSON-RPC message."""

    def __init__(self, inner: Any, log: Log) -> None:
        self._inner, self._log = inner, log

    async def send(self, item: SessionMessage) -> None:
        self._log.add(item.message)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> TapSend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def is_request(msg: Any, method: str) -> bool:
    return isinstance(msg, types.JSONRPCRequest) and msg.method == method


def is_notification(msg: Any, method: str) -> bool:
    return isinstance(msg, types.JSONRPCNotification) and msg.method == method


def answers(msg: Any, request_id: Any) -> bool:
    return isinstance(msg, types.JSONRPCResponse | types.JSONRPCError) and msg.id == request_id


def progress_token_of(msg: Any) -> Any:
    meta = (msg.params or {}).get("_meta") or {}
    return meta.get("progressToken")


# --------------------------------------------------------------------------------------
# Client side of MCP tasks (server -> client direction), on the dispatcher's request hook.
# --------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@dataclass
class ClientTask:
    task_id: str
    method: str
    ttl: int | None
    created_at: str = field(default_factory=_now)
    last_updated_at: str = field(default_factory=_now)
    status: str = "working"
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: types.ErrorData | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    polls: int = 0  # tasks/get requests the server made for this task
    result_fetches: int = 0  # tasks/result requests the server made for this task

    def wire(self) -> dict[str, Any]:
        task = types.Task(
            task_id=self.task_id,
            status=self.status,  # type: ignore[arg-type]
            status_message=self.status_message,
            created_at=self.created_at,
            last_updated_at=self.last_updated_at,
            ttl=self.ttl,
            poll_interval=100,
        )
        wire = task.model_dump(by_alias=True, mode="json", exclude_none=True)
        wire["ttl"] = self.ttl  # required on the wire, null meaning unlimited
        return wire

    def finish(self, status: str, message: str, *, result: dict[str, Any] | None = None,
               error: types.ErrorData | None = None) -> None:
        if self.done.is_set():
            return
        self.status, self.status_message, self.result, self.error = status, message, result, error
        self.last_updated_at = _now()
        self.done.set()


class TaskAwareDispatcher(JSONRPCDispatcher):
    """The SDK's JSON-RPC dispatcher, plus the receiver side of 2025-11-25 tasks.

    `ClientSession` drives `run(on_request, ...)`; the wrapper routes tasks/* and
    task-augmented sampling/elicitation requests here and everything else to the
    session's own handler (which runs the registered callbacks).
    """

    AUGMENTABLE = ("sampling/createMessage", "elicitation/create")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.client_tasks: dict[str, ClientTask] = {}
        self._task_ids = itertools.count(1)
        self._jobs: anyio.abc.TaskGroup | None = None

    async def run(  # type: ignore[override]
        self,
        on_request: OnRequest,
        on_notify: OnNotify,
        on_notify_intercept: OnNotifyIntercept | None = None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with anyio.create_task_group() as jobs:
            self._jobs = jobs
            try:
                await super().run(partial(self._route, on_request), on_notify, on_notify_intercept,
                                  task_status=task_status)
            finally:
                jobs.cancel_scope.cancel()

    def _task(self, params: Mapping[str, Any] | None) -> ClientTask:
        task_id = (params or {}).get("taskId")
        task = self.client_tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Task not found: {task_id!r}")
        return task

    async def _route(self, inner: OnRequest, dctx: Any, method: str,
                     params: Mapping[str, Any] | None) -> dict[str, Any]:
        if method == "tasks/get":
            task = self._task(params)
            task.polls += 1
            return task.wire()
        if method == "tasks/result":
            task = self._task(params)
            await task.done.wait()  # tasks/result blocks until the task is terminal (SEP-1686)
            task.result_fetches += 1
            if task.error is not None:
                raise MCPError.from_error_data(task.error)
            if task.result is None:
                raise MCPError(code=types.INVALID_REQUEST, message=f"Task {task.task_id} was {task.status}")
            meta = dict(task.result.get("_meta") or {})
            meta[RELATED_TASK] = {"taskId": task.task_id}
            return {**task.result, "_meta": meta}
        if method == "tasks/list":
            return {"tasks": [t.wire() for t in self.client_tasks.values()]}
        if method == "tasks/cancel":
            task = self._task(params)
            if task.done.is_set():
                raise MCPError(code=types.INVALID_PARAMS, message=f"Task {task.task_id} is already {task.status}")
            task.scope.cancel()
            task.finish("cancelled", "Cancelled by the requestor.")
            return task.wire()
        if method in self.AUGMENTABLE and isinstance((params or {}).get("task"), Mapping):
            assert self._jobs is not None
            ttl = params["task"].get("ttl")  # type: ignore[index]
            task = ClientTask(task_id=f"client-task-{next(self._task_ids)}", method=method,
                              ttl=ttl if isinstance(ttl, int) else None)
            self.client_tasks[task.task_id] = task
            plain = {k: v for k, v in params.items() if k != "task"}  # type: ignore[union-attr]
            self._jobs.start_soon(self._execute, task, inner, dctx, method, plain)
            return {"task": task.wire()}
        return await inner(dctx, method, params)

    async def _execute(self, task: ClientTask, inner: OnRequest, dctx: Any, method: str,
                       params: dict[str, Any]) -> None:
        """Run the session's ordinary handling (the SDK callbacks) as the task's work."""
        with task.scope:
            try:
                result = await inner(dctx, method, params)
            except MCPError as exc:
                task.finish("failed", exc.message, error=exc.error)
            else:
                task.finish("completed", "Done.", result=result)
        task.finish("cancelled", "Cancelled by the requestor.")  # no-op unless the scope was cancelled


# --------------------------------------------------------------------------------------
# The harness: one session, its callbacks, and what they recorded.
# --------------------------------------------------------------------------------------


@dataclass
class Harness:
    """The session plus what its callbacks and the wire taps recorded.

    The callbacks below are bound methods handed to `ClientSession`; `session` and
    `dispatcher` are filled in right after, before the session is entered.
    """

    wire_in: Log = field(default_factory=Log)  # every inbound JSON-RPC message, in wire order
    wire_out: Log = field(default_factory=Log)  # every outbound JSON-RPC message, in wire order
    notes: Log = field(default_factory=Log)  # server notifications, via the session's message_handler
    logs: Log = field(default_factory=Log)  # notifications/message params, via the logging callback
    task_status: Log = field(default_factory=Log)  # notifications/tasks/status params, via a NotificationBinding
    sampling: Log = field(default_factory=Log)  # sampling/createMessage params the sampling callback answered
    elicitations: Log = field(default_factory=Log)  # (params, _meta) the elicitation callback answered
    roots_requests: Log = field(default_factory=Log)  # the roots list returned for each roots/list
    transport_errors: Log = field(default_factory=Log)  # exceptions the transport surfaced to message_handler
    roots: list[tuple[str, str]] = field(default_factory=lambda: list(INITIAL_ROOTS))
    init: types.InitializeResult | None = None
    http: bool = False  # Streamable HTTP rather than stdio
    big_bytes: int | None = None  # --big-bytes
    session: ClientSession = field(init=False)
    dispatcher: TaskAwareDispatcher = field(init=False)

    async def on_sampling(self, ctx: ClientRequestContext,
                          params: types.CreateMessageRequestParams) -> types.CreateMessageResult | types.ErrorData:
        self.sampling.add(params)
        prompt = " ".join(block.text for m in params.messages for block in _blocks(m.content)
                          if isinstance(block, types.TextContent))
        if SAMPLING_REFUSAL in prompt:
            return types.ErrorData(code=-1, message="mesh-interop refused the sampling request")
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text=f"sampled<{prompt}>"),
                                         model=SAMPLING_MODEL, stop_reason="endTurn")

    async def on_elicitation(self, ctx: ClientRequestContext, params: Any) -> types.ElicitResult:
        self.elicitations.add((params, ctx.meta or {}))
        if isinstance(params, types.ElicitRequestURLParams):
            return types.ElicitResult(action="accept")  # "the user opened the URL"
        wanted = (params.requested_schema or {}).get("properties", {})
        return types.ElicitResult(action="accept", content={k: v for k, v in ELICIT_ANSWERS.items() if k in wanted})

    async def on_list_roots(self, ctx: ClientRequestContext) -> types.ListRootsResult:
        self.roots_requests.add(list(self.roots))
        return types.ListRootsResult(roots=[types.Root(uri=uri, name=name) for uri, name in self.roots])

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.add(params)

    async def on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.transport_errors.add(message)
        else:
            self.notes.add(message)

    async def on_task_status(self, params: types.TaskStatusNotificationParams) -> None:
        self.task_status.add(params)


def _blocks(content: Any) -> list[Any]:
    return content if isinstance(content, list) else [content]


def client_capabilities() -> types.ClientCapabilities:
    """Everything the server can use, including task-augmented sampling/elicitation.

    `ClientSession.initialize()` derives its capabilities from the callbacks and
    has no tasks entry, so the handshake below is done by hand with public API.
    """
    return types.ClientCapabilities(
        sampling=types.SamplingCapability(),
        elicitation=types.ElicitationCapability(form=types.FormElicitationCapability(),
                                                url=types.UrlElicitationCapability()),
        roots=types.RootsCapability(list_changed=True),
        tasks=types.ClientTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability(),
            requests=types.ClientTasksRequestsCapability(
                sampling=types.TasksSamplingCapability(create_message=types.TasksCreateMessageCapability()),
                elicitation=types.TasksElicitationCapability(create=types.TasksCreateElicitationCapability()),
            ),
        ),
    )


async def handshake(h: Harness) -> None:
    result = await h.session.send_request(
        types.InitializeRequest(params=types.InitializeRequestParams(
            protocol_version=PROTOCOL_VERSION, capabilities=client_capabilities(),
            client_info=types.Implementation(name="mcpmesh-interop", version="1.0.0"))),
        types.InitializeResult,
    )
    h.session.adopt(result)
    await h.session.send_notification(types.InitializedNotification())
    h.init = result
    # Cache tools (and their output schemas) once; call_tool would otherwise list per first call.
    await h.session.list_tools()


# --------------------------------------------------------------------------------------
# Small helpers for tool calls.
# --------------------------------------------------------------------------------------


def texts(result: types.CallToolResult) -> list[str]:
    return [c.text for c in result.content if isinstance(c, types.TextContent)]


async def call_ok(h: Harness, name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> types.CallToolResult:
    result = await h.session.call_tool(name, args or {}, **kwargs)
    expect(not result.is_error, f"{name} returned isError: {' | '.join(texts(result))[:300]}")
    return result


async def call_text(h: Harness, name: str, args: dict[str, Any] | None = None, **kwargs: Any) -> str:
    return "\n".join(texts(await call_ok(h, name, args, **kwargs)))


def gunzip_b64(blob: str) -> bytes:
    return gzip.decompress(base64.b64decode(blob))


async def call_tool_as_task(h: Harness, name: str, args: dict[str, Any]) -> types.CreateTaskResult:
    # Raw send: the typed tools/call path would validate the CreateTaskResult as a CallToolResult.
    raw = await h.dispatcher.send_raw_request("tools/call", {"name": name, "arguments": args, "task": {"ttl": 60_000}})
    return types.CreateTaskResult.model_validate(raw)


async def get_task(h: Harness, task_id: str) -> types.GetTaskResult:
    return await h.session.send_request(
        types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id)), types.GetTaskResult)


async def task_result(h: Harness, task_id: str) -> types.CallToolResult:
    return await h.session.send_request(
        types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id)), types.CallToolResult)


async def poll_task(h: Harness, task_id: str, until: set[str]) -> list[str]:
    """Poll tasks/get until the status is in `until`; returns the distinct statuses seen.

    Between polls it waits for the server's notifications/tasks/status for the task,
    falling back to the server-suggested pollInterval (the protocol's own cadence).
    """
    seen: list[str] = []
    while True:
        mark = h.task_status.mark()
        task = await get_task(h, task_id)
        expect(task.task_id == task_id, f"tasks/get answered for {task.task_id}, asked {task_id}")
        if not seen or seen[-1] != task.status:
            seen.append(task.status)
        if task.status in until:
            return seen
        expect(task.status not in TERMINAL_TASK_STATES, f"task ended {task.status}: {task.status_message}")
        with anyio.move_on_after((task.poll_interval or 1000) / 1000):
            await h.task_status.wait_for(lambda p: p.task_id == task_id, since=mark)


# --------------------------------------------------------------------------------------
# One exerciser per server-everything tool. Each returns a short deterministic detail.
# --------------------------------------------------------------------------------------


async def tool_echo(h: Harness) -> str:
    message = "héllo, mesh ✓ \"quoted\""
    text = await call_text(h, "echo", {"message": message})
    expect(text == f"Echo: {message}", f"echo returned {text!r}")
    return "message echoed"


async def tool_get_sum(h: Harness) -> str:
    text = await call_text(h, "get-sum", {"a": 2, "b": 3})
    expect(text == "The sum of 2 and 3 is 5.", f"get-sum returned {text!r}")
    return "2+3=5"


async def tool_get_tiny_image(h: Harness) -> str:
    result = await call_ok(h, "get-tiny-image")
    images = [c for c in result.content if isinstance(c, types.ImageContent)]
    expect(len(images) == 1, f"expected one image block, got {len(images)}")
    expect(images[0].mime_type == "image/png", f"image mimeType {images[0].mime_type}")
    expect(base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n"), "image data is not a PNG")
    return "image/png block with PNG data"


async def tool_get_structured_content(h: Harness) -> str:
    # call_tool also validates structuredContent against the tool's outputSchema.
    result = await call_ok(h, "get-structured-content", {"location": "Chicago"})
    expected = {"temperature": 36, "conditions": "Light rain / drizzle", "humidity": 82}
    expect(result.structured_content == expected, f"structuredContent {result.structured_content!r}")
    expect(json.loads(texts(result)[0]) == expected, "text block does not mirror structuredContent")
    return "structuredContent matches outputSchema and text"


async def tool_get_annotated_message(h: Harness) -> str:
    result = await call_ok(h, "get-annotated-message", {"messageType": "error", "includeImage": True})
    expect(len(result.content) == 2, f"expected text+image, got {len(result.content)} blocks")
    text, image = result.content
    expect(isinstance(text, types.TextContent) and text.text == "Error: Operation failed", f"text block {text!r}")
    expect(text.annotations and text.annotations.priority == 1.0
           and text.annotations.audience == ["user", "assistant"], f"text annotations {text.annotations!r}")
    expect(isinstance(image, types.ImageContent) and image.annotations and image.annotations.priority == 0.5,
           f"image annotations {getattr(image, 'annotations', None)!r}")
    return "priority/audience annotations on text and image"


async def tool_get_env(h: Harness) -> str:
    text = await call_text(h, "get-env")
    env = json.loads(text)
    expect(isinstance(env, dict) and env and all(isinstance(v, str) for v in env.values()),
           "get-env did not return a JSON object of strings")
    return "JSON object of environment variables"


async def tool_get_resource_links(h: Harness) -> str:
    result = await call_ok(h, "get-resource-links", {"count": 4})
    links = [c for c in result.content if isinstance(c, types.ResourceLink)]
    expect(len(links) == 4, f"expected 4 resource links, got {len(links)}")
    # Odd ids link blob resources, even ids text resources.
    expected = [f"demo://resource/dynamic/{'text' if i % 2 == 0 else 'blob'}/{i}" for i in range(1, 5)]
    expect([str(link.uri) for link in links] == expected, f"link URIs {[str(l.uri) for l in links]}")
    read = await h.session.read_resource(str(links[1].uri))  # a link must be readable
    expect(read.contents and getattr(read.contents[0], "text", "").startswith("Resource 2:"),
           "linked resource unreadable")
    return "4 resource_link blocks, linked resource readable"


async def tool_get_resource_reference(h: Harness) -> str:
    result = await call_ok(h, "get-resource-reference", {"resourceType": "Blob", "resourceId": 5})
    embedded = [c for c in result.content if isinstance(c, types.EmbeddedResource)]
    expect(len(embedded) == 1, f"expected one embedded resource, got {len(embedded)}")
    resource = embedded[0].resource
    expect(str(resource.uri) == "demo://resource/dynamic/blob/5", f"embedded uri {resource.uri}")
    expect(isinstance(resource, types.BlobResourceContents)
           and base64.b64decode(resource.blob).startswith(b"Resource 5: This is a base64 blob"),
           "embedded blob content")
    return "embedded blob resource 5"


async def tool_get_roots_list(h: Harness) -> str:
    text = await call_text(h, "get-roots-list")
    expect(f"Current MCP Roots ({len(h.roots)} total)" in text, f"roots summary missing: {text[:200]!r}")
    for uri, name in h.roots:
        expect(uri in text and name in text, f"root {uri} ({name}) missing from {text[:300]!r}")
    return f"server reports the {len(h.roots)} client roots"


async def tool_gzip_file_as_resource(h: Harness) -> str:
    original = "mcpmesh interop — gzip me, please. ✓\n" * 20
    data_uri = "data:text/plain;charset=utf-8;base64," + base64.b64encode(original.encode()).decode()  # no network
    inline = await call_ok(h, "gzip-file-as-resource",
                           {"name": "tools-inline.txt.gz", "data": data_uri, "outputType": "resource"})
    blob = inline.content[0]
    expect(isinstance(blob, types.EmbeddedResource) and isinstance(blob.resource, types.BlobResourceContents),
           f"outputType=resource gave {type(blob).__name__}")
    expect(blob.resource.mime_type == "application/gzip", f"mimeType {blob.resource.mime_type}")
    expect(gunzip_b64(blob.resource.blob).decode() == original, "inline gzip does not round-trip")
    linked = await call_ok(h, "gzip-file-as-resource", {"name": "tools-link.txt.gz", "data": data_uri})
    link = linked.content[0]
    expect(isinstance(link, types.ResourceLink) and str(link.uri) == "demo://resource/session/tools-link.txt.gz",
           f"outputType=resourceLink gave {link!r}")
    read = await h.session.read_resource(str(link.uri))
    expect(gunzip_b64(read.contents[0].blob).decode() == original, "session resource does not round-trip")
    return "data: URI gzipped inline and as a readable session resource"


async def tool_toggle_simulated_logging(h: Harness) -> str:
    expect("Started simulated" in await call_text(h, "toggle-simulated-logging"), "first toggle did not start")
    expect("Stopped simulated logging" in await call_text(h, "toggle-simulated-logging"), "second toggle did not stop")
    return "on, then off"


async def tool_toggle_subscriber_updates(h: Harness) -> str:
    expect("Started simulated resource updated" in await call_text(h, "toggle-subscriber-updates"),
           "first toggle did not start")
    expect("Stopped simulated resource updates" in await call_text(h, "toggle-subscriber-updates"),
           "second toggle did not stop")
    return "on, then off"


async def tool_trigger_long_running_operation(h: Harness) -> str:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    text = await call_text(h, "trigger-long-running-operation", {"duration": 0.2, "steps": 2},
                           progress_callback=on_progress)
    expect(text == "Long running operation completed. Duration: 0.2 seconds, Steps: 2.", f"result {text!r}")
    expect(seen == [(1.0, 2.0), (2.0, 2.0)], f"progress callback saw {seen}")
    return "completed after progress 1/2, 2/2"


async def sampling_roundtrip(h: Harness, tool: str, prompt: str) -> tuple[str, types.CreateMessageRequestParams]:
    """Call a sampling tool; returns its text and the request our callback answered."""
    mark = h.sampling.mark()
    text = await call_text(h, tool, {"prompt": prompt, "maxTokens": 42})
    asked = h.sampling.find(lambda p: prompt in json.dumps(p.model_dump(mode="json")), since=mark)
    expect(asked, f"{tool}: the sampling callback never saw the prompt")
    return text, asked[0].item


async def tool_trigger_sampling_request(h: Harness) -> str:
    prompt = "What is six times seven?"
    text, params = await sampling_roundtrip(h, "trigger-sampling-request", prompt)
    expect(params.max_tokens == 42 and params.system_prompt == "You are a helpful test server.",
           f"sampling params {params.max_tokens} / {params.system_prompt!r}")
    expect(text.startswith("LLM sampling result:"), f"unexpected text {text[:80]!r}")
    answer = json.loads(text.split("\n", 1)[1])
    expected = f"sampled<Resource trigger-sampling-request context: {prompt}>"
    expect(answer.get("model") == SAMPLING_MODEL and answer.get("content", {}).get("text") == expected,
           f"sampling answer not reflected: {answer!r}")
    return "callback answer returned in the tool result"


async def tool_trigger_elicitation_request(h: Harness) -> str:
    mark = h.elicitations.mark()
    text = await call_text(h, "trigger-elicitation-request")
    expect(h.elicitations.find(lambda e: "Please provide inputs" in e[0].message, since=mark),
           "the elicitation callback was not called")
    for line in ["✅ User provided the requested information!", "- Name: Ada Mesh", "- Agreed to terms: true",
                 "- Email: ada@example.com", "- Favorite Integer: 42", "- Favorite Number: 3.5"]:
        expect(line in text, f"{line!r} missing from the result")
    return "form accepted, content reflected"


async def url_elicitation_roundtrip(h: Harness, elicitation_id: str) -> str:
    """Error path (-32042) first, then the retry takes the request path (elicitation/create, mode url)."""
    url = "https://example.invalid/mcpmesh/consent"  # only shown to the "user"; nothing fetches it
    args = {"url": url, "elicitationId": elicitation_id, "errorPath": True}
    try:
        await h.session.call_tool("trigger-url-elicitation", args)
        raise CheckError("errorPath=true did not fail with -32042")
    except MCPError as exc:
        expect(exc.code == types.URL_ELICITATION_REQUIRED, f"error code {exc.code}, expected -32042")
        required = UrlElicitationRequiredError.from_error(exc.error).elicitations
        expect(required and required[0].url == "https://modelcontextprotocol.io", f"prerequisite {required!r}")
    mark = h.elicitations.mark()
    text = await call_text(h, "trigger-url-elicitation", args)  # retry after "satisfying" the prerequisite
    asked = h.elicitations.find(lambda e: isinstance(e[0], types.ElicitRequestURLParams)
                                and e[0].elicitation_id == elicitation_id, since=mark)
    expect(asked and asked[0].item[0].url == url, "the URL elicitation callback was not called with the URL")
    expect("User completed the URL elicitation flow" in text and f"Elicitation ID: {elicitation_id}" in text,
           f"result {text[:200]!r}")
    return "-32042 error path, then url-mode elicitation accepted"


async def tool_trigger_url_elicitation(h: Harness) -> str:
    return await url_elicitation_roundtrip(h, "tools-url-1")


async def research(h: Harness, topic: str) -> tuple[str, list[str]]:
    """simulate-research-query as a client->server task: create, poll, fetch the result."""
    created = await call_tool_as_task(h, "simulate-research-query", {"topic": topic})
    task_id = created.task.task_id
    statuses = await poll_task(h, task_id, {"completed"})
    result = await task_result(h, task_id)
    expect((result.meta or {}).get(RELATED_TASK, {}).get("taskId") == task_id, "tasks/result lacks related-task meta")
    text = "\n".join(texts(result))
    expect(f"# Research Report: {topic}" in text, f"report missing: {text[:120]!r}")
    return task_id, statuses


async def tool_simulate_research_query(h: Harness) -> str:
    _, statuses = await research(h, "mesh transports")
    return f"task {' -> '.join(statuses)}, report fetched via tasks/result"


def client_task_from(h: Harness, text: str, method: str) -> ClientTask:
    found = re.search(r"Task created: (\S+)", text)
    expect(found, f"no 'Task created' in {text[:200]!r}")
    task = h.dispatcher.client_tasks.get(found.group(1))
    expect(task is not None and task.method == method, f"server names unknown client task {found.group(1)!r}")
    expect(task.status == "completed" and task.polls >= 1 and task.result_fetches == 1,
           f"client task {task.status}, {task.polls} tasks/get, {task.result_fetches} tasks/result")
    return task


async def tool_trigger_sampling_request_async(h: Harness) -> str:
    prompt = "Summarise the mesh in one word."
    text, _ = await sampling_roundtrip(h, "trigger-sampling-request-async", prompt)
    expect(text.startswith("[COMPLETED] Async sampling completed!"), f"result {text[:120]!r}")
    client_task_from(h, text, "sampling/createMessage")
    answer = json.loads(text.split("**Result:**\n", 1)[1])
    expected = f"sampled<Resource trigger-sampling-request-async context: {prompt}>"
    expect(answer.get("content", {}).get("text") == expected and answer.get("model") == SAMPLING_MODEL,
           f"task result not reflected: {answer!r}")
    return "client ran sampling as a task; server polled tasks/get and fetched tasks/result"


async def tool_trigger_elicitation_request_async(h: Harness) -> str:
    text = await call_text(h, "trigger-elicitation-request-async")
    expect(text.startswith("[COMPLETED] User provided the requested information!"), f"result {text[:120]!r}")
    client_task_from(h, text, "elicitation/create")
    for line in ["- Name: Ada Mesh", "- Favorite Color: Blue", "- Agreed to terms: true"]:
        expect(line in text, f"{line!r} missing from the result")
    return "client ran elicitation as a task; server polled tasks/get and fetched tasks/result"


TOOL_EXERCISERS: dict[str, Callable[[Harness], Awaitable[str]]] = {
    "echo": tool_echo,
    "get-annotated-message": tool_get_annotated_message,
    "get-env": tool_get_env,
    "get-resource-links": tool_get_resource_links,
    "get-resource-reference": tool_get_resource_reference,
    "get-roots-list": tool_get_roots_list,
    "get-structured-content": tool_get_structured_content,
    "get-sum": tool_get_sum,
    "get-tiny-image": tool_get_tiny_image,
    "gzip-file-as-resource": tool_gzip_file_as_resource,
    "simulate-research-query": tool_simulate_research_query,
    "toggle-simulated-logging": tool_toggle_simulated_logging,
    "toggle-subscriber-updates": tool_toggle_subscriber_updates,
    "trigger-elicitation-request": tool_trigger_elicitation_request,
    "trigger-elicitation-request-async": tool_trigger_elicitation_request_async,
    "trigger-long-running-operation": tool_trigger_long_running_operation,
    "trigger-sampling-request": tool_trigger_sampling_request,
    "trigger-sampling-request-async": tool_trigger_sampling_request_async,
    "trigger-url-elicitation": tool_trigger_url_elicitation,
}


# --------------------------------------------------------------------------------------
# The checks.
# --------------------------------------------------------------------------------------


async def check_initialize(h: Harness) -> str:
    init = h.init
    assert init is not None
    expect(h.session.protocol_version == PROTOCOL_VERSION, f"negotiated {h.session.protocol_version}")
    expect(init.server_info.name == "mcp-servers/everything", f"server name {init.server_info.name!r}")
    expect((init.instructions or "").strip(), "instructions are empty")
    caps = init.capabilities
    expect(caps.tools is not None, "no tools capability")
    expect(caps.resources is not None and caps.resources.subscribe, "no resources.subscribe capability")
    expect(caps.prompts is not None, "no prompts capability")
    expect(caps.logging is not None, "no logging capability")
    expect(caps.completions is not None, "no completions capability")
    tasks = caps.tasks
    expect(tasks is not None and tasks.list is not None and tasks.cancel is not None
           and tasks.requests is not None and tasks.requests.tools is not None
           and tasks.requests.tools.call is not None, f"tasks capability {tasks!r}")
    return (f"{init.server_info.name} {init.server_info.version} protocol {init.protocol_version}; "
            "tools, resources(subscribe), prompts, logging, completions, tasks")


async def check_tools_listing(h: Harness) -> tuple[list[str], str]:
    names: list[str] = []
    cursor: str | None = None
    while True:  # follow pagination, if the server ever paginates
        page = await h.session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        names += [t.name for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    uncovered = sorted(set(names) - set(TOOL_EXERCISERS))
    missing = sorted(set(TOOL_EXERCISERS) - set(names))
    expect(not uncovered, f"listed but not covered by this driver (new in server-everything?): {', '.join(uncovered)}")
    expect(not missing, f"not listed (capability-gated registration failed?): {', '.join(missing)}")
    return names, f"{len(names)} tools listed, each one has an exerciser"


async def check_resources(h: Harness) -> str:
    listed: list[types.Resource] = []
    cursor, pages = None, 0
    while True:
        page = await h.session.list_resources(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        listed += page.resources
        pages += 1
        cursor = page.next_cursor
        if not cursor:
            break
    static = [r for r in listed if str(r.uri).startswith("demo://resource/static/document/")]
    expect(static, "no static document resources listed")
    doc = await h.session.read_resource("demo://resource/static/document/features.md")
    text = doc.contents[0]
    expect(isinstance(text, types.TextResourceContents) and text.text.startswith("# Everything Server")
           and text.mime_type == "text/markdown", "features.md is not the expected markdown text")
    blob = await h.session.read_resource("demo://resource/dynamic/blob/7")
    content = blob.contents[0]
    expect(isinstance(content, types.BlobResourceContents)
           and base64.b64decode(content.blob).startswith(b"Resource 7: This is a base64 blob"), "blob resource 7")
    templates = (await h.session.list_resource_templates()).resource_templates
    uris = sorted(t.uri_template for t in templates)
    expect(uris == ["demo://resource/dynamic/blob/{resourceId}", "demo://resource/dynamic/text/{resourceId}"],
           f"templates {uris}")
    templated = await h.session.read_resource("demo://resource/dynamic/text/3")
    expect(getattr(templated.contents[0], "text", "").startswith("Resource 3: This is a plaintext resource"),
           "templated text resource 3")
    completion = await h.session.complete(
        types.ResourceTemplateReference(uri="demo://resource/dynamic/text/{resourceId}"),
        {"name": "resourceId", "value": "12"})
    expect(completion.completion.values == ["12"], f"template completion {completion.completion.values}")

    # Subscriptions. Every `toggle-subscriber-updates` that turns updates on sends one
    # notifications/resources/updated per subscribed URI at once (in subscription order).
    first, second = "demo://resource/dynamic/text/1", "demo://resource/dynamic/text/2"
    await h.session.subscribe_resource(first)
    mark = h.notes.mark()
    expect("Started" in await call_text(h, "toggle-subscriber-updates"), "updates did not start")
    await h.notes.wait_for(lambda n: isinstance(n, types.ResourceUpdatedNotification) and n.params.uri == first, mark)
    expect("Stopped" in await call_text(h, "toggle-subscriber-updates"), "updates did not stop")
    # Unsubscribe `first` while `second` is subscribed: the next burst must name only `second`.
    await h.session.subscribe_resource(second)
    await h.session.unsubscribe_resource(first)
    wire_mark, mark = h.wire_in.mark(), h.notes.mark()
    expect("Started" in await call_text(h, "toggle-subscriber-updates"), "updates did not restart")
    await h.notes.wait_for(lambda n: isinstance(n, types.ResourceUpdatedNotification) and n.params.uri == second, mark)
    expect("Stopped" in await call_text(h, "toggle-subscriber-updates"), "updates did not stop again")
    await h.session.unsubscribe_resource(second)
    # `first` was subscribed earlier, so an update for it would have been sent (and arrived) before `second`'s.
    stale = h.wire_in.find(lambda m: is_notification(m, "notifications/resources/updated")
                           and (m.params or {}).get("uri") == first, wire_mark)
    expect(not stale, "an update arrived for an unsubscribed URI")
    return (f"{len(static)} static documents ({'1 page' if pages == 1 else 'paginated'}), text+blob+templated reads, "
            "template completion, resources/updated after subscribe and none after unsubscribe")


PROMPT_ARGUMENTS: dict[str, dict[str, str]] = {
    "simple-prompt": {},
    "args-prompt": {"city": "Zürich", "state": "ZH"},
    "completable-prompt": {"department": "Engineering", "name": "Alice"},
    "resource-prompt": {"resourceType": "Blob", "resourceId": "2"},
}
PROMPT_FIRST_TEXT = {
    "simple-prompt": "This is a simple prompt without arguments.",
    "args-prompt": "What's weather in Zürich, ZH?",
    "completable-prompt": "Please promote Alice to the head of the Engineering team.",
    "resource-prompt": "This prompt includes the Blob resource with id: 2. Please analyze the following resource:",
}


async def check_prompts(h: Harness) -> str:
    prompts = (await h.session.list_prompts()).prompts
    names = [p.name for p in prompts]
    uncovered = sorted(set(names) - set(PROMPT_ARGUMENTS))
    expect(not uncovered, f"prompts not covered by this driver: {', '.join(uncovered)}")
    expect(set(PROMPT_ARGUMENTS) <= set(names), f"prompts missing: {sorted(set(PROMPT_ARGUMENTS) - set(names))}")
    for name in names:
        got = await h.session.get_prompt(name, PROMPT_ARGUMENTS[name])
        first = got.messages[0].content
        expect(isinstance(first, types.TextContent) and first.text == PROMPT_FIRST_TEXT[name],
               f"{name}: first message {first!r}")
    embedded = (await h.session.get_prompt("resource-prompt", PROMPT_ARGUMENTS["resource-prompt"])).messages[1].content
    expect(isinstance(embedded, types.EmbeddedResource)
           and str(embedded.resource.uri) == "demo://resource/dynamic/blob/2", "resource-prompt embedded resource")
    ref = types.PromptReference(name="completable-prompt")
    departments = await h.session.complete(ref, {"name": "department", "value": "S"})
    expect(departments.completion.values == ["Sales", "Support"],
           f"department completions {departments.completion.values}")
    members = await h.session.complete(ref, {"name": "name", "value": ""},
                                       context_arguments={"department": "Engineering"})
    expect(members.completion.values == ["Alice", "Bob", "Charlie"], f"context completions {members.completion.values}")
    return f"{len(names)} prompts fetched with arguments; completion/complete with and without context"


async def check_ping(h: Harness) -> str:
    result = await h.session.send_ping()
    expect(isinstance(result, types.EmptyResult), f"ping answered {result!r}")
    return "pong"


def is_simulated(params: types.LoggingMessageNotificationParams) -> bool:
    return isinstance(params.data, str) and "level" in params.data and "message" in params.data


async def check_logging(h: Harness) -> str:
    threshold = "warning"
    out_mark = h.wire_out.mark()
    await h.session.set_logging_level(threshold)
    set_level = h.wire_out.find(lambda m: is_request(m, "logging/setLevel"), out_mark)[-1].item
    answered = h.wire_in.find(lambda m: answers(m, set_level.id))
    expect(answered, "logging/setLevel response not seen on the wire")
    applied_at = answered[0].seq  # whatever the server sent after this response, it sent under the new level
    mark = h.logs.mark()
    # Each toggle-on sends one message of a random level at once (then every 5 s): cycle on/off
    # until one at or above the threshold reaches the logging callback.
    for _ in range(60):
        expect("Started" in await call_text(h, "toggle-simulated-logging"), "simulated logging did not start")
        expect("Stopped" in await call_text(h, "toggle-simulated-logging"), "simulated logging did not stop")
        if h.logs.find(is_simulated, mark):
            break
    got = (await h.logs.wait_for(is_simulated, mark)).item
    expect(LOG_LEVELS.index(got.level) >= LOG_LEVELS.index(threshold), f"callback got a {got.level} message")
    below = [m for m in (e.item for e in h.wire_in.entries if e.seq > applied_at)
             if is_notification(m, "notifications/message")
             and LOG_LEVELS.index((m.params or {}).get("level", "debug")) < LOG_LEVELS.index(threshold)]
    if below:
        raise CheckError(f"server sent a {below[0].params.get('level')} message after setLevel {threshold}")
    await h.session.set_logging_level("debug")
    return f"setLevel {threshold}; simulated messages reach the logging callback, none below {threshold}"


async def check_progress(h: Harness) -> str:
    seen: list[tuple[float, float | None]] = []
    out_mark, in_mark = h.wire_out.mark(), h.wire_in.mark()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    await call_ok(h, "trigger-long-running-operation", {"duration": 0.6, "steps": 3}, progress_callback=on_progress)
    request = h.wire_out.find(lambda m: is_request(m, "tools/call") and progress_token_of(m) is not None,
                              out_mark)[-1].item
    token = progress_token_of(request)
    inbound = [e.item for e in h.wire_in.entries[in_mark:]]
    response_at = next(i for i, m in enumerate(inbound) if answers(m, request.id))
    on_wire = [(i, m.params) for i, m in enumerate(inbound)
               if is_notification(m, "notifications/progress") and m.params.get("progressToken") == token]
    expect([p["progress"] for _, p in on_wire] == [1, 2, 3], f"progress on the wire {[p for _, p in on_wire]}")
    expect(all(i < response_at for i, _ in on_wire), "a progress notification arrived after the result")
    # The SDK runs progress callbacks as tasks; they are queued before the result is, so all have run.
    expect(seen == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)], f"progress callback saw {seen}")
    return "3 notifications/progress (1/3, 2/3, 3/3) before the result, delivered to the callback in order"


async def check_list_changed(h: Harness) -> str:
    # server -> client: registering the capability-gated tools after `initialized` emits tools/list_changed.
    await h.notes.wait_for(lambda n: isinstance(n, types.ToolListChangedNotification))
    tools = {t.name for t in (await h.session.list_tools()).tools}
    expect({"trigger-sampling-request-async", "get-roots-list"} <= tools, "re-listed tools lack the gated tools")
    # server -> client: gzip-file-as-resource registers a session resource -> resources/list_changed.
    mark = h.notes.mark()
    data_uri = "data:text/plain;base64," + base64.b64encode(b"list changed probe").decode()
    await call_ok(h, "gzip-file-as-resource", {"name": "list-changed-probe.gz", "data": data_uri})
    await h.notes.wait_for(lambda n: isinstance(n, types.ResourceListChangedNotification), mark)
    listed = {str(r.uri) for r in (await h.session.list_resources()).resources}
    expect("demo://resource/session/list-changed-probe.gz" in listed, "new session resource not listed")
    # client -> server: roots/list_changed makes the server ask for roots/list again. The server
    # installs that handler when it first syncs roots, so wait for that first roots/list.
    await h.roots_requests.wait_for(lambda _: True)
    mark, out_mark = h.roots_requests.mark(), h.wire_out.mark()
    h.roots.append(("file:///srv/mesh/added-later", "Added later"))
    await h.session.send_roots_list_changed()
    expect(h.wire_out.find(lambda m: is_notification(m, "notifications/roots/list_changed"), out_mark),
           "notifications/roots/list_changed was not sent")
    requested = (await h.roots_requests.wait_for(lambda _: True, mark)).item
    expect(("file:///srv/mesh/added-later", "Added later") in requested, "re-requested roots lack the new root")
    expect("file:///srv/mesh/added-later" in await call_text(h, "get-roots-list"), "server did not keep the new roots")
    return ("tools/list_changed and resources/list_changed received; "
            "roots/list_changed sent and answered by a new roots/list (prompts never change here)")


async def check_server_requests(h: Harness) -> str:
    await tool_trigger_sampling_request(h)
    # An error from the sampling callback travels back to the server and into the tool result.
    refused = await h.session.call_tool("trigger-sampling-request", {"prompt": SAMPLING_REFUSAL})
    expect(refused.is_error and "mesh-interop refused the sampling request" in " ".join(texts(refused)),
           f"refusal not propagated: {texts(refused)}")
    await tool_trigger_elicitation_request(h)
    await url_elicitation_roundtrip(h, "server-requests-url-1")
    await tool_get_roots_list(h)
    return ("sampling/createMessage (answer and error), elicitation/create (form and url), "
            "roots/list answered by callbacks and reflected in tool results")


async def check_tasks(h: Harness) -> str:
    details: dict[str, str] = {}

    async def plain() -> None:
        task_id, statuses = await research(h, "mesh tasks")
        # The server also announced completion with notifications/tasks/status (seen via the binding).
        await h.task_status.wait_for(lambda p: p.task_id == task_id and p.status == "completed")
        details["plain"] = " -> ".join(statuses)
        details["plain_id"] = task_id

    async def ambiguous() -> None:
        # Ambiguous topics make the server ask for clarification; that elicitation/create is
        # queued on the task and delivered once we call tasks/result (which blocks until done).
        created = await call_tool_as_task(h, "simulate-research-query", {"topic": "python", "ambiguous": True})
        task_id = created.task.task_id
        details["ambiguous_id"] = task_id
        statuses = await poll_task(h, task_id, {"input_required"})
        mark = h.elicitations.mark()
        result = await task_result(h, task_id)
        asked = h.elicitations.find(lambda e: e[1].get(RELATED_TASK, {}).get("taskId") == task_id, mark)
        expect(asked, "the clarification elicitation did not carry related-task meta")
        text = "\n".join(texts(result))
        expect("# Research Report: python (programming)" in text, f"clarification not used: {text[:120]!r}")
        details["ambiguous"] = " -> ".join(statuses + ["elicitation", "result"])

    async def server_to_client() -> None:
        await tool_trigger_sampling_request_async(h)
        await tool_trigger_elicitation_request_async(h)

    async with anyio.create_task_group() as tg:
        tg.start_soon(plain)
        tg.start_soon(ambiguous)
        tg.start_soon(server_to_client)
        # tasks/cancel on a third task while the others run.
        created = await call_tool_as_task(h, "simulate-research-query", {"topic": "to be cancelled"})
        victim = created.task.task_id
        cancelled = await h.session.send_request(
            types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=victim)), types.CancelTaskResult)
        expect(cancelled.status == "cancelled", f"tasks/cancel answered {cancelled.status}")
        expect((await get_task(h, victim)).status == "cancelled", "cancelled task does not stay cancelled")
    listed: set[str] = set()
    cursor = None
    while True:  # tasks/list, following pagination
        page = await h.session.send_request(
            types.ListTasksRequest(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None),
            types.ListTasksResult)
        listed |= {t.task_id for t in page.tasks}
        cursor = page.next_cursor
        if not cursor:
            break
    mine = {details["plain_id"], details["ambiguous_id"], victim}
    expect(mine <= listed, f"tasks/list lacks {sorted(mine - listed)}")
    return (f"tools/call task {details['plain']}; ambiguous task {details['ambiguous']}; "
            "tasks/list and tasks/cancel; server->client sampling and elicitation tasks")


async def check_cancellation(h: Harness) -> str:
    steps, duration = 6, 3  # a progress notification every 0.5 s; the server ignores the abort
    out_mark, in_mark = h.wire_out.mark(), h.wire_in.mark()
    first_progress = anyio.Event()
    finished: list[bool] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        first_progress.set()

    call_scope = anyio.CancelScope()

    async def long_call() -> None:
        with call_scope:
            await h.session.call_tool("trigger-long-running-operation", {"duration": duration, "steps": steps},
                                      progress_callback=on_progress)
            finished.append(True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(long_call)
        await first_progress.wait()  # the operation is running on the server
        call_scope.cancel()  # abandoning the call makes the SDK send notifications/cancelled
    expect(not finished, "the call completed although it was cancelled")
    request = h.wire_out.find(lambda m: is_request(m, "tools/call") and (m.params or {}).get("name")
                              == "trigger-long-running-operation", out_mark)[-1].item
    expect(h.wire_out.find(lambda m: is_notification(m, "notifications/cancelled")
                           and (m.params or {}).get("requestId") == request.id, out_mark),
           "no notifications/cancelled was sent for the request")
    await h.session.send_ping()
    expect(await call_text(h, "echo", {"message": "still here"}) == "Echo: still here", "echo after cancel")
    # The server keeps running the handler (it reports progress to the end) but must never answer it.
    await h.wire_in.wait_for(lambda m: is_notification(m, "notifications/progress")
                             and m.params.get("progressToken") == request.id and m.params.get("progress") == steps,
                             in_mark)
    await h.session.send_ping()  # anything the handler wrote on finishing precedes this pong
    expect(not h.wire_in.find(lambda m: answers(m, request.id), in_mark), "the server answered the cancelled request")
    return "notifications/cancelled sent; ping and echo still answered; the cancelled call never answered"


async def check_pipelined(h: Harness) -> str:
    count = 25
    replies: dict[int, str] = {}
    out_mark, in_mark = h.wire_out.mark(), h.wire_in.mark()

    async def one(i: int) -> None:
        replies[i] = await call_text(h, "echo", {"message": f"pipelined #{i:02d} {'ü' * i}"})

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    wrong = [i for i in range(count) if replies.get(i) != f"Echo: pipelined #{i:02d} {'ü' * i}"]
    expect(not wrong, f"mismatched replies for calls {wrong}")
    # Were requests really in flight together? Replay the wire in order.
    ids = {e.item.id for e in h.wire_out.find(lambda m: is_request(m, "tools/call"), out_mark)}
    events = sorted([(e.seq, +1) for e in h.wire_out.entries[out_mark:] if getattr(e.item, "id", None) in ids
                     and isinstance(e.item, types.JSONRPCRequest)]
                    + [(e.seq, -1) for e in h.wire_in.entries[in_mark:] if isinstance(e.item, types.JSONRPCResponse)
                       and e.item.id in ids])
    in_flight = max(itertools.accumulate(delta for _, delta in events))
    expect(in_flight >= 2, "the echo calls never overlapped on the wire")
    return f"{count} concurrent echo calls, each answered with its own message"


def awkward_text(target_bytes: int) -> str:
    """Deterministic text of about `target_bytes` UTF-8 bytes, heavy on JSON escapes and multi-byte chars."""
    unit = ("é中😀e\u0301a\u0308ñ\u2028\u2029\"\\/\u0001\t\n\r\u0000\u001f\u007f\u0085\ufeff\ufffd𝄞"
            "\\u0041 \\\" '<>&{}[]:, 🇺🇳 👩\u200d💻 Ω≈ç√∫ Ǆǅ ﬁ \U0010fffd end\\")
    reps = -(-target_bytes // len(unit.encode()))
    return unit * reps


async def check_big_utf8(h: Harness) -> str:
    payload = awkward_text(h.big_bytes or (HTTP_BIG_UTF8_BYTES if h.http else 4 * 1024 * 1024))
    text = await call_text(h, "echo", {"message": payload})
    expected = f"Echo: {payload}"
    if text != expected:
        at = next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b), min(len(text), len(expected)))
        raise CheckError(f"echo differs at char {at} (got {len(text)} chars, expected {len(expected)})")
    return f"{len(payload.encode())} UTF-8 bytes of escape-heavy text echoed intact"


Check = Callable[[Harness], Awaitable[str]]
CHECKS: list[tuple[str, Check | None]] = [
    ("initialize", check_initialize),
    ("tools", None),  # special: one line for the listing plus one line per tool
    ("resources", check_resources),
    ("prompts", check_prompts),
    ("ping", check_ping),
    ("logging", check_logging),
    ("progress", check_progress),
    ("list-changed", check_list_changed),
    ("server-requests", check_server_requests),
    ("tasks", check_tasks),
    ("cancellation", check_cancellation),
    ("pipelined", check_pipelined),
    ("big-utf8", check_big_utf8),
]


# --------------------------------------------------------------------------------------
# Running and reporting.
# --------------------------------------------------------------------------------------


def reason_of(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, CheckError):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return f"timed out after {CHECK_TIMEOUT:.0f} s"
    return f"{type(exc).__name__}: {exc}"


class Reporter:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def line(self, name: str, ok: bool, text: str) -> None:
        if ok:
            self.passed += 1
            print(f"ok   {name} {text}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {name}: {text}", flush=True)


async def attempt(h: Harness, fn: Check) -> tuple[bool, str]:
    """Run one check under its time bound; a transport fault during it fails it too."""
    errors_mark = h.transport_errors.mark()
    try:
        with anyio.fail_after(CHECK_TIMEOUT):
            detail = await fn(h)
    except Exception as exc:  # every failure, including ExceptionGroups and timeouts, is a FAIL line
        return False, reason_of(exc)
    faults = h.transport_errors.find(lambda _: True, errors_mark)
    if faults:
        return False, f"transport error: {faults[0].item!r}"
    return True, detail


async def run_tools(h: Harness, report: Reporter, only_tools: set[str] | None) -> None:
    ok, outcome = True, ""
    names: list[str] = []

    async def listing(h: Harness) -> str:
        nonlocal names
        names, detail = await check_tools_listing(h)
        return detail

    ok, outcome = await attempt(h, listing)
    report.line("tools", ok, outcome)
    if not names:
        names = list(TOOL_EXERCISERS)
    selected = [n for n in names if n in TOOL_EXERCISERS and (only_tools is None or n in only_tools)]
    # The tools are independent, so run them concurrently (the slow task-based ones overlap);
    # report in listing order so the output does not depend on timing.
    results: dict[str, tuple[bool, str]] = {}

    async def run_one(name: str) -> None:
        results[name] = await attempt(h, TOOL_EXERCISERS[name])

    async with anyio.create_task_group() as tg:
        for name in selected:
            tg.start_soon(run_one, name)
    for name in selected:
        report.line(f"tool:{name}", *results[name])


class StandaloneStreamFirst(httpx2.AsyncBaseTransport):
    """httpx2 transport that holds the `notifications/initialized` POST until the GET stream opens.

    Streamable HTTP gives a server's unrelated messages (those answering no POST) only the
    client's GET stream, and a server may drop them while no GET stream is open. The TypeScript
    SDK's transport does ("Stream is disconnected - event is stored for replay, nothing more to
    do", webStandardStreamableHttp.js `send`; the replay needs a Last-Event-ID the client never
    saw). The SDK client opens its GET stream when it sends `notifications/initialized`
    (`post_writer`: `start_get_stream()`, then the POST), so the two race; server-everything
    answers `initialized` with tools/list_changed at once and roots/list 350 ms later. Letting
    the GET response headers arrive first makes delivery deterministic. The GET finishing in
    any way (an error status, a refused connection) releases the POST too. Without a session
    id the SDK opens no GET stream (`handle_get_stream` returns at once), so nothing is held.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner
        self._session_id_seen = False
        self.get_opened = anyio.Event()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST" and self._session_id_seen and _is_initialized_body(request.content):
            with anyio.move_on_after(GET_STREAM_WAIT):
                await self.get_opened.wait()
        try:
            response = await self._inner.handle_async_request(request)
        finally:
            if request.method == "GET":
                self.get_opened.set()
        if response.headers.get("mcp-session-id"):
            self._session_id_seen = True
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _is_initialized_body(body: bytes) -> bool:
    if b"notifications/initialized" not in body:
        return False
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("method") == "notifications/initialized"


@dataclass
class Target:
    """Where the server is: a command to spawn (stdio) or a Streamable HTTP endpoint."""

    command: list[str] | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@asynccontextmanager
async def connect(target: Target) -> AsyncIterator[tuple[Any, Any]]:
    if target.url is None:
        assert target.command
        server = StdioServerParameters(command=target.command[0], args=target.command[1:], env=dict(os.environ))
        async with stdio_client(server) as streams:
            yield streams
        return
    client = httpx2.AsyncClient(
        headers=target.headers,
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),  # the SDK's defaults
        transport=StandaloneStreamFirst(httpx2.AsyncHTTPTransport()),
    )
    async with client, streamable_http_client(target.url, http_client=client, max_sse_event_size=None) as streams:
        yield streams


async def run(target: Target, only: set[str] | None, big_bytes: int | None = None) -> Reporter:
    report = Reporter()
    wanted = [name for name, _ in CHECKS if only is None or name in only
              or (name == "tools" and any(o.startswith("tool:") for o in only))]
    only_tools = None if only is None or "tools" in only else {o[len("tool:"):] for o in only if o.startswith("tool:")}
    h = Harness(http=target.url is not None, big_bytes=big_bytes)
    try:
        async with connect(target) as (read_stream, write_stream):
            h.dispatcher = TaskAwareDispatcher(TapReceive(read_stream, h.wire_in), TapSend(write_stream, h.wire_out))
            h.session = ClientSession(
                dispatcher=h.dispatcher,
                sampling_callback=h.on_sampling,
                elicitation_callback=h.on_elicitation,
                list_roots_callback=h.on_list_roots,
                logging_callback=h.on_log,
                message_handler=h.on_message,
                # notifications/tasks/status is not in the SDK's 2025-11-25 tables; bind it explicitly.
                notification_bindings=[NotificationBinding(method="notifications/tasks/status",
                                                           params_type=types.TaskStatusNotificationParams,
                                                           handler=h.on_task_status)],
            )
            async with h.session:
                try:
                    with anyio.fail_after(CHECK_TIMEOUT):
                        await handshake(h)
                except Exception as exc:
                    report.line("initialize", False, f"handshake failed: {reason_of(exc)}")
                    for name in wanted:
                        if name != "initialize":
                            report.line(name, False, "not run: no session")
                    return report
                for name, fn in CHECKS:
                    if name not in wanted:
                        continue
                    if fn is None:
                        await run_tools(h, report, only_tools)
                    else:
                        report.line(name, *await attempt(h, fn))
    except Exception as exc:  # the server could not be started or reached, or the transport died
        report.line("session", False, reason_of(exc))
    return report


def main() -> int:
    sys.stdout.reconfigure(errors="backslashreplace")  # a FAIL reason may quote any text
    argv = sys.argv[1:]
    if "--" not in argv and not any(a == "--url" or a.startswith("--url=") for a in argv):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="everything_client.py")
    parser.add_argument("--only", help="comma-separated check names (or tool:<name>)")
    parser.add_argument("--url", help="Streamable HTTP endpoint to connect to instead of spawning a command")
    parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                        help="HTTP header for every request (--url only; repeatable)")
    parser.add_argument("--big-bytes", type=int, default=None, metavar="N",
                        help="size of the big-utf8 payload (default 4 MiB; 3 MiB with --url)")
    options = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if options.url is not None:
        if command:
            parser.error("give either --url or a server command after --, not both")
        headers: dict[str, str] = {}
        for header in options.header:
            name, sep, value = header.partition("=")
            if not sep or not name.strip():
                parser.error(f"--header wants NAME=VALUE, got {header!r}")
            headers[name.strip()] = value
        target = Target(url=options.url, headers=headers)
    else:
        if options.header:
            parser.error("--header needs --url")
        if not command:
            parser.error("no server command after --")
        target = Target(command=command)
    only = {n.strip() for n in options.only.split(",") if n.strip()} if options.only else None
    known = {name for name, _ in CHECKS}
    unknown = sorted(n for n in only or ()
                     if n not in known and not (n.startswith("tool:") and n[len("tool:"):] in TOOL_EXERCISERS))
    if unknown:
        parser.error(f"unknown check(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    report = anyio.run(run, target, only, options.big_bytes)
    print(json.dumps({"passed": report.passed, "failed": report.failed}, separators=(",", ":")), flush=True)
    return 0 if report.failed == 0 and report.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
