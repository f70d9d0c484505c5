"""The client under test for the official MCP conformance suite's client auth scenarios
(`@modelcontextprotocol/conformance client --scenario auth/...`), in one of two roles.

Usage (the suite appends the URL of the scenario's MCP server and sets MCP_CONFORMANCE_SCENARIO,
and MCP_CONFORMANCE_CONTEXT where the scenario hands the client something):

    python conformance_client.py mesh SERVER_URL
    python conformance_client.py sdk SERVER_URL

Both roles do what the suite's own reference client does: connect, list the tools, call
`test-tool`, close; both offer the same Client ID Metadata Document URL (the one the suite
accepts) and, where the scenario gives them, its pre-registered client or client credentials.

mesh — the node as the OAuth client, the way a user runs it. Environment:
    MCPMESH_BIN                 the mcpmesh binary
    CONFORMANCE_SERVING_HOME    the profile of the node that serves the scenario's URL
    CONFORMANCE_CALLING_HOME    the profile of the node an AI client calls it from
    CONFORMANCE_CALLER          the calling node's name at the serving node
    CONFORMANCE_SERVING_PEER    the serving node's name at the calling node
  The serving node serves SERVER_URL as a `url` service (`serve NAME --url SERVER_URL`, with
  `--client-id`/`--client-secret-file` where the scenario pre-registers a client, and
  `--client-credentials` (with `--client-key-file` for a key) in the client-credentials
  scenarios; otherwise `--client-metadata-url`); an MCP
  session through `mcpmesh connect PEER/NAME` on the calling node (raw JSON-RPC lines over its
  stdio) meets -32056 until a grant exists; the command the error names (`mcpmesh auth NAME`)
  is then run with browser.py as the browser, and the session is opened again. The node never
  authorizes by itself: each authorization is one such run, at most three per scenario (a user
  told three times that the grant wants more scope stops). Nothing else is retried.

sdk — the official Python SDK's own client (`mcp` 2.3.0): `OAuthClientProvider` (the
  authorization code with PKCE; the authorization URL fetched without following its redirect,
  the code taken from the Location, as the suite's reference client does),
  `ClientCredentialsOAuthProvider` / `PrivateKeyJWTOAuthProvider` for the client-credentials
  scenarios, `mcp.Client` over `streamable_http_client` in the 2025-11-25 era.

Exit 0 when the connect, list and call all succeeded; 1 otherwise (the reason on stderr).
Secrets never go to stdout or stderr. Bounded: every step has a timeout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any
from urllib.parse import parse_qs, urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
BROWSER = os.path.join(HERE, "browser.py")
CIMD_URL = "https://conformance-test.local/client-metadata.json"
REDIRECT_URI = "http://localhost:3000/callback"
MAX_AUTHORIZATIONS = 3
STEP_SECONDS = 30


def log(text: str) -> None:
    print(f"conformance_client: {text}", file=sys.stderr, flush=True)


def context() -> dict[str, Any]:
    raw = os.environ.get("MCP_CONFORMANCE_CONTEXT")
    return json.loads(raw) if raw else {}


# ---------------------------------------------------------------------------------------------
# mesh


class McpError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(f"{error.get('code')} {error.get('message')}")
        self.error = error


class Session:
    """`mcpmesh connect PEER/NAME` on the calling node, spoken to in JSON-RPC lines."""

    def __init__(self, target: str) -> None:
        self.process = subprocess.Popen(
            [os.environ["MCPMESH_BIN"], "--home", os.environ["CONFORMANCE_CALLING_HOME"], "connect", target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.read_line()
            message = json.loads(line)
            if message.get("id") != self.next_id or "method" in message:
                continue  # notifications (and requests this client does not answer)
            if "error" in message:
                raise McpError(message["error"])
            return message["result"]

    def notify(self, method: str) -> None:
        self.send({"jsonrpc": "2.0", "method": method})

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def read_line(self) -> bytes:
        assert self.process.stdout is not None
        import selectors

        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(STEP_SECONDS):
                raise TimeoutError(f"no answer within {STEP_SECONDS}s")
        line = self.process.stdout.readline()
        if not line:
            raise EOFError("mcpmesh connect ended")
        return line

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=STEP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serving(*args: str) -> dict[str, Any]:
    """A verb on the serving node, its `--json` answer."""
    run = subprocess.run(
        [os.environ["MCPMESH_BIN"], "--home", os.environ["CONFORMANCE_SERVING_HOME"], "--json", *args],
        capture_output=True,
        timeout=STEP_SECONDS,
    )
    if run.returncode != 0:
        raise RuntimeError(f"mcpmesh {args[0]} failed ({run.returncode}): {run.stderr.decode(errors='replace')[-400:]}")
    return json.loads(run.stdout)


def private_file(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text)
    return path


def mesh(url: str, scenario: str) -> None:
    name = "c-" + re.sub(r"[^a-z0-9]+", "-", scenario.lower()).strip("-")
    serve = ["serve", name, "--allow", os.environ["CONFORMANCE_CALLER"], "--url", url, "--replace"]
    ctx = context()
    secret_dir = tempfile.TemporaryDirectory()
    if "client_id" in ctx:
        serve += ["--client-id", ctx["client_id"]]
        if scenario.startswith("auth/client-credentials-"):
            serve.append("--client-credentials")
        if ctx.get("client_secret"):
            serve += ["--client-secret-file", private_file(secret_dir.name, "secret", ctx["client_secret"])]
        if ctx.get("private_key_pem"):
            # The key stays in its file (read at each token request): beside the profile.
            keys = os.path.join(os.environ["CONFORMANCE_SERVING_HOME"], "conformance-keys")
            os.makedirs(keys, mode=0o700, exist_ok=True)
            serve += ["--client-key-file", private_file(keys, f"{name}.pem", ctx["private_key_pem"])]
    else:
        serve += ["--client-metadata-url", CIMD_URL]
    # No --oauth: the node finds that the server requires a grant on its first 401.
    serving(*serve)
    secret_dir.cleanup()

    target = f"{os.environ['CONFORMANCE_SERVING_PEER']}/{name}"
    authorizations = 0
    while True:
        session = Session(target)
        try:
            session.request(
                "initialize",
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "conformance-mesh-client", "version": "1.0.0"},
                },
            )
            session.notify("notifications/initialized")
            session.request("tools/list", {})
            session.request("tools/call", {"name": "test-tool", "arguments": {}})
            log(f"connected, listed and called through {target} after {authorizations} authorization(s)")
            return
        except McpError as e:
            data = e.error.get("data") or {}
            if e.error.get("code") != -32056:
                raise
            if authorizations == MAX_AUTHORIZATIONS:
                raise RuntimeError(f"still {e} after {authorizations} authorizations") from None
            command = str(data.get("command", ""))
            if command != f"mcpmesh auth {name}":
                raise RuntimeError(f"-32056 names {command!r}, not `mcpmesh auth {name}`") from None
            log(f"-32056 ({e.error.get('message')}): running `{command}`")
            authorizations += 1
            made = serving("auth", name, "--browser", f"{sys.executable} {BROWSER}")
            if made.get("authorized") is not True:
                raise RuntimeError(f"auth answered {made}") from None
        finally:
            session.close()


# ---------------------------------------------------------------------------------------------
# sdk


async def sdk(url: str, scenario: str) -> None:
    import anyio
    import httpx2

    from mcp import Client
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.auth.extensions.client_credentials import (
        ClientCredentialsOAuthProvider,
        PrivateKeyJWTOAuthProvider,
        SignedJWTParameters,
    )
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

    class MemoryStorage:
        def __init__(self) -> None:
            self.tokens: OAuthToken | None = None
            self.client_info: OAuthClientInformationFull | None = None

        async def get_tokens(self) -> OAuthToken | None:
            return self.tokens

        async def set_tokens(self, tokens: OAuthToken) -> None:
            self.tokens = tokens

        async def get_client_info(self) -> OAuthClientInformationFull | None:
            return self.client_info

        async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
            self.client_info = client_info

    storage = MemoryStorage()
    ctx = context()
    redirected: list[AuthorizationCodeResult] = []

    async def redirect_handler(authorization_url: str) -> None:
        async with httpx2.AsyncClient(follow_redirects=False, trust_env=False) as http:
            answer = await http.get(authorization_url)
        query = parse_qs(urlsplit(answer.headers.get("location", "")).query)
        code = query.get("code", [None])[0]
        if code is None:
            raise RuntimeError(f"the authorization answered {answer.status_code} without a code")
        redirected.append(
            AuthorizationCodeResult(code=code, state=query.get("state", [None])[0], iss=query.get("iss", [None])[0])
        )

    async def callback_handler() -> AuthorizationCodeResult:
        return redirected.pop()

    auth: Any
    if ctx.get("name") == "auth/client-credentials-basic":
        auth = ClientCredentialsOAuthProvider(
            server_url=url, storage=storage, client_id=ctx["client_id"], client_secret=ctx["client_secret"]
        )
    elif ctx.get("name") == "auth/client-credentials-jwt":
        jwt = SignedJWTParameters(
            issuer=ctx["client_id"],
            subject=ctx["client_id"],
            signing_key=ctx["private_key_pem"],
            signing_algorithm=ctx.get("signing_algorithm", "ES256"),
        )
        auth = PrivateKeyJWTOAuthProvider(
            server_url=url,
            storage=storage,
            client_id=ctx["client_id"],
            assertion_provider=jwt.create_assertion_provider(),
        )
    else:
        if "client_id" in ctx:
            storage.client_info = OAuthClientInformationFull(
                client_id=ctx["client_id"],
                client_secret=ctx.get("client_secret"),
                redirect_uris=[REDIRECT_URI],
                token_endpoint_auth_method="client_secret_basic",
            )
        auth = OAuthClientProvider(
            server_url=url,
            client_metadata=OAuthClientMetadata(
                client_name="conformance-sdk-client",
                redirect_uris=[REDIRECT_URI],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
            ),
            storage=storage,
            redirect_handler=redirect_handler,
            callback_handler=callback_handler,
            client_metadata_url=CIMD_URL,
        )
    with anyio.fail_after(STEP_SECONDS):
        async with httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(STEP_SECONDS), trust_env=False) as http:
            client = Client(
                streamable_http_client(url, http_client=http), mode="legacy", read_timeout_seconds=STEP_SECONDS, cache=None
            )
            async with client:
                await client.list_tools()
                await client.call_tool("test-tool", {})
    log(f"connected, listed and called {scenario}")


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("mesh", "sdk"):
        print(__doc__, file=sys.stderr)
        return 2
    role, url = sys.argv[1], sys.argv[2]
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    try:
        if role == "mesh":
            mesh(url, scenario)
        else:
            import anyio

            anyio.run(sdk, url, scenario)
    except Exception as e:  # noqa: BLE001 — the reason is the output
        log(f"{role} client failed: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
