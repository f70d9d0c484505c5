"""Self-check of tests/interop/oauth_server.py and tests/interop/browser.py (official Python SDK, `mcp` 2.3.0).

Usage:
    python oauth_selfcheck.py

Starts `oauth_server.py --token-ttl 2` as a subprocess (loopback, port picked by the kernel),
plus a loopback "client redirect URI" (http://127.0.0.1:CB/callback, a tiny http.server that
records the query of each visit and answers 200), and checks, one line each:

  raw HTTP (`requests`), the way a hand-written client would talk:
    metadata        RFC 8414 AS metadata and RFC 9728 protected-resource metadata
    unauthenticated POST /mcp without a token: 401 + WWW-Authenticate resource_metadata=PRM URL
    register        RFC 7591 registration of a public client (token_endpoint_auth_method none)
    browser-refuses browser.py refuses a non-loopback URL (exit 2) without contacting it
    authorize       browser.py walks /authorize -> 302 -> callback: code, state echoed, iss = issuer
    pkce            a wrong code_verifier is refused (invalid_grant)
    token           authorization_code grant: token JSON (access_token, token_type, expires_in,
                    scope, refresh_token)
    code-reuse      the code is single-use (invalid_grant)
    mcp-ok          the access token opens /mcp (initialize: 200)
    expiry          the 2 s access token is refused after 3 s (401, invalid_token)
    refresh         refresh_token grant: new access AND refresh token; the old refresh token is
                    then refused (invalid_grant); the new access token opens /mcp
    invalid-target  a wrong RFC 8707 resource: /token answers invalid_target, /authorize
                    redirects back with error=invalid_target and iss
    scope-403       a token with only mcp:write gets 403 error="insufficient_scope"
    revoke          RFC 7009 /revoke of a refresh token drops its grant (refresh + access)
    revoke-all      POST /admin/revoke-all answers {"revoked": N}; the next refresh fails
                    (invalid_grant) and the access token gets 401
  the SDK's own client (`OAuthClientProvider` on an httpx2 client, `streamable_http_client`,
  `mcp.Client`), redirect_handler = browser.py, callback_handler = the loopback callback:
    sdk-echo-modern discovery, registration (client_secret_post), authorization, token, echo at
                    2026-07-28
    sdk-echo-legacy the same tokens, a 2025-11-25 session, echo
    sdk-refresh     3 s later (token expired) the SDK refreshes (rotated refresh token) and echoes
    sdk-reauth      after /admin/revoke-all the SDK re-authorizes through the browser and echoes
  and finally:
    log             server log lines (listening once, request/registered/authorized/token/
                    token refused/revoked-all) present, no token/code/verifier/secret printed
    sigterm         SIGTERM -> exit 0

Prints `ok   <check> <detail>` per passed check, `FAIL <reason>` and stops at the first failure
(then the tail of the server log goes to stderr); exit 0 only if everything passed. Everything is bounded (60 s per SDK step).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "oauth_server.py")
BROWSER = os.path.join(HERE, "browser.py")
TTL = 2
STEP_TIMEOUT = 60.0
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "oauth_selfcheck", "version": "1.0.0"},
    },
}


class Failure(Exception):
    pass


def ok(name: str, detail: str = "") -> None:
    print(f"ok   {name} {detail}".rstrip(), flush=True)


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise Failure(what)


# Every secret value seen on the wire; none may appear in the server's log.
SECRETS: set[str] = set()


def remember(*values: str | None) -> None:
    SECRETS.update(v for v in values if v)


class Server:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, *args], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._drain, daemon=True).start()
        if not self.ready.wait(20):
            self.proc.kill()
            raise Failure("server did not announce `listening on` within 20 s: " + " | ".join(self.lines))
        self.base = self.url.removesuffix("/mcp")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("listening on ") and not self.ready.is_set():
                self.url = line.split()[-1]
                self.ready.set()

    def log_since(self, mark: int) -> list[str]:
        return self.lines[mark:]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


class Callback:
    """The client's loopback redirect URI: records each visit's query, answers 200."""

    def __init__(self) -> None:
        self.visits: queue.Queue[dict[str, str]] = queue.Queue()
        visits = self.visits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                parts = urlsplit(self.path)
                if parts.path != "/callback":
                    self.send_error(404)
                    return
                visits.put(dict(parse_qsl(parts.query, keep_blank_values=True)))
                body = b"authorization complete, you may close this window\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/callback"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def take(self, timeout: float = 10) -> dict[str, str]:
        try:
            return self.visits.get(timeout=timeout)
        except queue.Empty:
            raise Failure("the callback was not visited") from None


def browse(url: str) -> tuple[int, str]:
    run = subprocess.run([sys.executable, BROWSER, url], capture_output=True, text=True, timeout=20)
    return run.returncode, run.stderr


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    remember(verifier, challenge)
    return verifier, challenge


class Raw:
    """Hand-made OAuth requests with `requests`."""

    def __init__(self, server: Server, callback: Callback) -> None:
        self.s = requests.Session()
        self.s.trust_env = False
        self.server = server
        self.callback = callback
        self.base = server.base
        self.rs = server.url

    def register(self, scope: str | None = None, method: str = "none") -> dict[str, Any]:
        body: dict[str, Any] = {
            "client_name": "oauth_selfcheck raw",
            "redirect_uris": [self.callback.url],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": method,
        }
        if scope is not None:
            body["scope"] = scope
        r = self.s.post(self.base + "/register", json=body, timeout=10)
        expect(r.status_code == 201, f"register: HTTP {r.status_code} {r.text}")
        client = r.json()
        remember(client.get("client_secret"))
        return client

    def authorize_url(self, client: dict[str, Any], challenge: str, state: str, **extra: str) -> str:
        query = {
            "response_type": "code",
            "client_id": client["client_id"],
            "redirect_uri": self.callback.url,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": state,
            **extra,
        }
        return self.base + "/authorize?" + urlencode(query)

    def authorize(self, client: dict[str, Any], challenge: str, **extra: str) -> dict[str, str]:
        state = secrets.token_urlsafe(12)
        remember(state)
        rc, log = browse(self.authorize_url(client, challenge, state, **extra))
        expect(rc == 0, f"browser.py exit {rc}: {log}")
        visit = self.callback.take()
        remember(visit.get("code"))
        expect(visit.get("state") == state, "state not echoed")
        return visit

    def token(self, client: dict[str, Any], **form: str) -> requests.Response:
        data = {"client_id": client["client_id"], **form}
        if client.get("client_secret"):
            data["client_secret"] = client["client_secret"]
        r = self.s.post(self.base + "/token", data=data, timeout=10)
        if r.status_code == 200:
            remember(r.json().get("access_token"), r.json().get("refresh_token"))
        return r

    def code_grant(self, client: dict[str, Any], code: str, verifier: str, **extra: str) -> requests.Response:
        return self.token(
            client, grant_type="authorization_code", code=code, redirect_uri=self.callback.url, code_verifier=verifier, **extra
        )

    def refresh(self, client: dict[str, Any], refresh_token: str, **extra: str) -> requests.Response:
        return self.token(client, grant_type="refresh_token", refresh_token=refresh_token, **extra)

    def mcp(self, access_token: str | None) -> requests.Response:
        headers = dict(MCP_HEADERS)
        if access_token is not None:
            headers["Authorization"] = f"Bearer {access_token}"
        return self.s.post(self.rs, json=INITIALIZE, headers=headers, timeout=10)

    def login(self, client: dict[str, Any], scope: str | None = None) -> dict[str, Any]:
        verifier, challenge = pkce()
        extra = {"resource": self.rs}
        if scope is not None:
            extra["scope"] = scope
        visit = self.authorize(client, challenge, **extra)
        r = self.code_grant(client, visit["code"], verifier, resource=self.rs)
        expect(r.status_code == 200, f"token: HTTP {r.status_code} {r.text}")
        return r.json()


def www_authenticate(r: requests.Response) -> str:
    return r.headers.get("www-authenticate", "")


def raw_checks(server: Server, callback: Callback) -> None:
    raw = Raw(server, callback)
    issuer, rs = server.base, server.url
    prm_url = f"{issuer}/.well-known/oauth-protected-resource/mcp"

    asm = raw.s.get(issuer + "/.well-known/oauth-authorization-server", timeout=10).json()
    expect(asm["issuer"] == issuer, f"issuer {asm['issuer']!r} != {issuer!r}")
    for key, path in (
        ("authorization_endpoint", "/authorize"),
        ("token_endpoint", "/token"),
        ("registration_endpoint", "/register"),
        ("revocation_endpoint", "/revoke"),
    ):
        expect(asm.get(key) == issuer + path, f"{key} = {asm.get(key)!r}")
    expect(asm.get("code_challenge_methods_supported") == ["S256"], "S256 only")
    expect(asm.get("grant_types_supported") == ["authorization_code", "refresh_token"], "grant types")
    expect(asm.get("scopes_supported") == ["mcp:read", "mcp:write"], "AS scopes")
    expect(asm.get("authorization_response_iss_parameter_supported") is True, "RFC 9207 flag")
    expect("none" in asm.get("token_endpoint_auth_methods_supported", []), "public clients advertised")
    prm = raw.s.get(prm_url, timeout=10).json()
    expect(prm == {
        "resource": rs,
        "authorization_servers": [issuer],
        "scopes_supported": ["mcp:read"],
        "bearer_methods_supported": ["header"],
    }, f"PRM {prm}")
    ok("metadata", f"issuer={issuer} prm={json.dumps(prm, separators=(',', ':'))}")

    r = raw.mcp(None)
    expected = (
        f'Bearer error="invalid_token", error_description="Authentication required", resource_metadata="{prm_url}"'
    )
    expect(r.status_code == 401, f"no token: HTTP {r.status_code}")
    expect(www_authenticate(r) == expected, f"WWW-Authenticate {www_authenticate(r)!r}")
    ok("unauthenticated", f"401 WWW-Authenticate: {www_authenticate(r)}")

    mark = len(server.lines)
    client = raw.register()
    expect(client.get("token_endpoint_auth_method") == "none" and "client_secret" not in client, "public client")
    expect(client.get("scope") == "mcp:read mcp:write", f"default scope {client.get('scope')!r}")
    time.sleep(0.2)
    expect(
        f'registered: client_id={client["client_id"]} redirect_uris=["{callback.url}"]' in server.log_since(mark),
        "registered log line",
    )
    ok("register", f"client_id={client['client_id']} auth=none scope={client['scope']!r}")

    rc, log = browse("http://example.com/authorize?code=secret")
    expect(rc == 2 and "secret" not in log, f"browser.py on example.com: exit {rc} {log!r}")
    ok("browser-refuses", log.strip())

    verifier, challenge = pkce()
    state = secrets.token_urlsafe(12)
    remember(state)
    rc, blog = browse(raw.authorize_url(client, challenge, state, scope="mcp:read mcp:write", resource=rs))
    expect(rc == 0, f"browser.py exit {rc}: {blog}")
    visit = callback.take()
    remember(visit.get("code"))
    expect(set(visit) == {"code", "state", "iss"}, f"callback query keys {sorted(visit)}")
    expect(visit["state"] == state and visit["iss"] == issuer, "state/iss")
    expect(all(v not in blog for v in (visit["code"], state, challenge)), "browser.py printed a secret")
    ok("authorize", f"callback keys={sorted(visit)} iss={visit['iss']}; browser: " + " | ".join(blog.strip().splitlines()))

    r = raw.code_grant(client, visit["code"], "x" * 50, resource=rs)
    expect(r.status_code == 400 and r.json().get("error") == "invalid_grant", f"bad verifier: {r.status_code} {r.text}")
    ok("pkce", f"wrong verifier -> {r.status_code} {r.json()}")

    r = raw.code_grant(client, visit["code"], verifier, resource=rs)
    expect(r.status_code == 200, f"token: HTTP {r.status_code} {r.text}")
    tokens = r.json()
    expect(sorted(tokens) == ["access_token", "expires_in", "refresh_token", "scope", "token_type"], f"fields {sorted(tokens)}")
    expect(tokens["token_type"] == "Bearer" and tokens["expires_in"] == TTL, "token_type / expires_in")
    expect(tokens["scope"] == "mcp:read mcp:write", f"scope {tokens['scope']!r}")
    expect(r.headers.get("cache-control") == "no-store", "Cache-Control: no-store")
    shape = {k: (v if k in ("token_type", "expires_in", "scope") else "<opaque>") for k, v in tokens.items()}
    ok("token", json.dumps(shape))

    r = raw.code_grant(client, visit["code"], verifier, resource=rs)
    expect(r.status_code == 400 and r.json().get("error") == "invalid_grant", f"code reuse: {r.status_code} {r.text}")
    ok("code-reuse", f"-> {r.status_code} {r.json()['error']}")

    issued = time.time()
    r = raw.mcp(tokens["access_token"])
    expect(r.status_code == 200, f"/mcp with token: HTTP {r.status_code} {r.text}")
    ok("mcp-ok", f"initialize -> {r.status_code} {r.headers.get('content-type')}")

    time.sleep(max(0.0, issued + TTL + 1 - time.time()))
    r = raw.mcp(tokens["access_token"])
    expect(r.status_code == 401 and 'error="invalid_token"' in www_authenticate(r), f"expired: HTTP {r.status_code}")
    ok("expiry", f"after {time.time() - issued:.1f} s -> 401")

    r = raw.refresh(client, tokens["refresh_token"], resource=rs)
    expect(r.status_code == 200, f"refresh: HTTP {r.status_code} {r.text}")
    fresh = r.json()
    expect(fresh["refresh_token"] != tokens["refresh_token"], "refresh token not rotated")
    expect(fresh["access_token"] != tokens["access_token"], "access token not renewed")
    r = raw.refresh(client, tokens["refresh_token"], resource=rs)
    expect(r.status_code == 400 and r.json().get("error") == "invalid_grant", f"old refresh token: {r.status_code} {r.text}")
    expect(raw.mcp(fresh["access_token"]).status_code == 200, "new access token refused")
    ok("refresh", "new refresh token issued, old one -> invalid_grant, new access token accepted")

    r = raw.refresh(client, fresh["refresh_token"], resource="http://127.0.0.1:1/elsewhere")
    expect(r.status_code == 400 and r.json().get("error") == "invalid_target", f"token wrong resource: {r.status_code} {r.text}")
    _, challenge2 = pkce()
    state2 = secrets.token_urlsafe(12)
    rc, _ = browse(raw.authorize_url(client, challenge2, state2, resource="http://127.0.0.1:1/elsewhere"))
    bad = callback.take()
    expect(rc == 0 and bad.get("error") == "invalid_target", f"authorize wrong resource: {bad}")
    expect(bad.get("iss") == issuer and bad.get("state") == state2, f"error redirect {bad}")
    ok("invalid-target", f"/token -> 400 invalid_target; /authorize -> redirect keys={sorted(bad)}")

    writer = raw.register(scope="mcp:write", method="client_secret_post")
    wtokens = raw.login(writer, scope="mcp:write")
    r = raw.mcp(wtokens["access_token"])
    expect(r.status_code == 403, f"mcp:write only: HTTP {r.status_code}")
    expect('error="insufficient_scope"' in www_authenticate(r) and prm_url in www_authenticate(r), "403 header")
    ok("scope-403", f"403 WWW-Authenticate: {www_authenticate(r)}")

    r = raw.s.post(
        issuer + "/revoke",
        data={"client_id": writer["client_id"], "client_secret": writer["client_secret"], "token": wtokens["refresh_token"]},
        timeout=10,
    )
    expect(r.status_code == 200, f"revoke: HTTP {r.status_code} {r.text}")
    r = raw.refresh(writer, wtokens["refresh_token"])
    expect(r.status_code == 400 and r.json().get("error") == "invalid_grant", f"revoked refresh: {r.status_code}")
    expect(raw.mcp(wtokens["access_token"]).status_code == 401, "revoked grant's access token still accepted")
    ok("revoke", "refresh token -> invalid_grant, its access token -> 401")

    # A live pair right before the admin call (the 2 s access tokens above may have expired).
    r = raw.refresh(client, fresh["refresh_token"], resource=rs)
    expect(r.status_code == 200, f"refresh: HTTP {r.status_code} {r.text}")
    live = r.json()
    expect(raw.mcp(live["access_token"]).status_code == 200, "live access token refused")
    mark = len(server.lines)
    r = raw.s.post(issuer + "/admin/revoke-all", timeout=10)
    expect(r.status_code == 200, f"revoke-all: HTTP {r.status_code}")
    count = r.json().get("revoked")
    expect(isinstance(count, int) and count >= 2, f"revoke-all body {r.json()}")
    r2 = raw.refresh(client, live["refresh_token"], resource=rs)
    expect(r2.status_code == 400 and r2.json().get("error") == "invalid_grant", f"refresh after revoke-all: {r2.status_code}")
    expect(raw.mcp(live["access_token"]).status_code == 401, "access token survived revoke-all")
    time.sleep(0.2)
    expect(f"revoked-all: {count}" in server.log_since(mark), "revoked-all log line")
    expect("token refused: invalid_grant grant=refresh_token" in server.log_since(mark), "token refused log line")
    ok("revoke-all", f"{r.json()}; next refresh -> invalid_grant; access token -> 401")


def sdk_checks(server: Server, callback: Callback) -> None:
    import anyio
    import httpx2
    import mcp_types as types

    from mcp import Client
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

    class MemoryStorage:
        def __init__(self) -> None:
            self.tokens: OAuthToken | None = None
            self.client_info: OAuthClientInformationFull | None = None

        async def get_tokens(self) -> OAuthToken | None:
            return self.tokens

        async def set_tokens(self, tokens: OAuthToken) -> None:
            remember(tokens.access_token, tokens.refresh_token)
            self.tokens = tokens

        async def get_client_info(self) -> OAuthClientInformationFull | None:
            return self.client_info

        async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
            remember(client_info.client_secret)
            self.client_info = client_info

    # The SDK logs a failed refresh (expected in sdk-reauth) at WARNING; keep the output to the checks.
    logging.getLogger("mcp.client.auth").setLevel(logging.ERROR)
    storage = MemoryStorage()
    browser_runs: list[int] = []

    async def redirect_handler(authorization_url: str) -> None:
        run = await anyio.run_process([sys.executable, BROWSER, authorization_url], check=False)
        browser_runs.append(run.returncode)

    async def callback_handler() -> AuthorizationCodeResult:
        visit = await anyio.to_thread.run_sync(callback.take)
        remember(visit.get("code"), visit.get("state"))
        if "code" not in visit:
            raise Failure(f"authorization refused: {visit.get('error')}")
        return AuthorizationCodeResult(code=visit["code"], state=visit.get("state"), iss=visit.get("iss"))

    auth = OAuthClientProvider(
        server_url=server.url,
        client_metadata=OAuthClientMetadata(
            client_name="oauth_selfcheck sdk",
            redirect_uris=[callback.url],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=storage,
        redirect_handler=redirect_handler,
        callback_handler=callback_handler,
    )

    async def echo(http: Any, mode: str, text: str) -> str:
        client = Client(
            streamable_http_client(server.url, http_client=http), mode=mode, read_timeout_seconds=30, cache=None
        )
        async with client:
            result = await client.call_tool("echo", {"text": text})
            era = client.protocol_version
        texts = [c.text for c in result.content if isinstance(c, types.TextContent)]
        expect(texts == [text] and not result.is_error, f"echo answered {texts} is_error={result.is_error}")
        return str(era)

    def count(prefix: str, since: int) -> int:
        return sum(1 for line in server.log_since(since) if line.startswith(prefix))

    async def run() -> None:
        async with httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30, read=300)) as http:
            mark = len(server.lines)
            with anyio.fail_after(STEP_TIMEOUT):
                era = await echo(http, "auto", "hello modern")
            expect(era == "2026-07-28", f"era {era}")
            expect(browser_runs == [0], f"browser runs {browser_runs}")
            info = storage.client_info
            expect(info is not None and info.token_endpoint_auth_method == "client_secret_post", "SDK registration")
            expect(count("authorized: ", mark) == 1 and count("token: grant=authorization_code", mark) == 1, "one authorization")
            authorized = next(line for line in server.log_since(mark) if line.startswith("authorized: "))
            ok("sdk-echo-modern", f"era={era} via browser.py; server: {authorized}")

            with anyio.fail_after(STEP_TIMEOUT):
                era = await echo(http, "legacy", "hello legacy")
            expect(era == "2025-11-25", f"era {era}")
            ok("sdk-echo-legacy", f"era={era}, same token")

            assert storage.tokens is not None
            old_refresh = storage.tokens.refresh_token
            await anyio.sleep(TTL + 1)
            mark = len(server.lines)
            with anyio.fail_after(STEP_TIMEOUT):
                await echo(http, "auto", "hello after expiry")
            expect(count("token: grant=refresh_token", mark) >= 1, "no refresh in the server log")
            expect(storage.tokens.refresh_token != old_refresh, "SDK did not get a rotated refresh token")
            expect(len(browser_runs) == 1, "SDK re-authorized instead of refreshing")
            ok("sdk-refresh", "expired token refreshed by the SDK, rotated refresh token stored, echo ok")

            r = await http.post(server.base + "/admin/revoke-all")  # no Authorization: no 401 here
            expect(r.status_code == 200, f"revoke-all HTTP {r.status_code}")
            mark = len(server.lines)
            await anyio.sleep(TTL + 1)  # expired: the SDK tries a refresh first, which now fails
            with anyio.fail_after(STEP_TIMEOUT):
                await echo(http, "auto", "hello after revoke-all")
            expect(count("token refused: invalid_grant grant=refresh_token", mark) == 1, "refresh refusal not logged")
            expect(count("authorized: ", mark) == 1 and browser_runs == [0, 0], f"re-authorization {browser_runs}")
            ok("sdk-reauth", "refresh -> invalid_grant, SDK re-authorized via browser.py, echo ok")

    anyio.run(run)


def log_checks(server: Server) -> None:
    time.sleep(0.3)
    text = "\n".join(server.lines)
    expect(sum(1 for line in server.lines if line.startswith("listening on ")) == 1, "listening line count")
    expect(server.lines[0] == f"listening on {server.url}", f"first line {server.lines[0]!r}")
    for prefix in ("request: ", "registered: ", "authorized: ", "token: ", "token refused: ", "revoked-all: ", "revoked: ", "authorize refused: "):
        expect(any(line.startswith(prefix) for line in server.lines), f"no `{prefix}` line")
    leaked = [s for s in SECRETS if s in text]
    expect(not leaked, f"{len(leaked)} secret value(s) in the server log")
    unexpected = [
        line
        for line in server.lines
        if not line.startswith(
            ("listening on ", "request: ", "registered: ", "authorized: ", "authorize refused: ", "token: ", "token refused: ", "revoked", )
        )
    ]
    expect(not unexpected, f"unexpected log lines: {unexpected[:5]}")
    kinds: dict[str, int] = {}
    for line in server.lines:
        key = line.split(":")[0] if not line.startswith("listening") else "listening"
        kinds[key] = kinds.get(key, 0) + 1
    ok("log", f"{len(server.lines)} lines {json.dumps(kinds, sort_keys=True)}; none of {len(SECRETS)} secret values printed")


def main() -> int:
    callback = Callback()
    server = Server("--token-ttl", str(TTL))
    try:
        raw_checks(server, callback)
        sdk_checks(server, callback)
        log_checks(server)
    except Failure as exc:
        print(f"FAIL {exc}", flush=True)
        print("server log:\n  " + "\n  ".join(server.lines[-40:]), file=sys.stderr)
        server.stop()
        return 1
    except Exception as exc:  # noqa: BLE001 - any crash is a failure
        print(f"FAIL {type(exc).__name__}: {exc}", flush=True)
        print("server log:\n  " + "\n  ".join(server.lines[-40:]), file=sys.stderr)
        server.stop()
        return 1
    finally:
        callback.httpd.shutdown()
    rc = server.stop()
    if rc != 0:
        print(f"FAIL sigterm: exit {rc}", flush=True)
        return 1
    ok("sigterm", "exit 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
