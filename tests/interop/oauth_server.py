"""OAuth-protected Streamable HTTP MCP server for the mcpmesh interop tests (official Python SDK, `mcp` 2.3.0).

Usage:
    python oauth_server.py [--port N] [--token-ttl SECS] [--scopes S1,S2] [--required-scopes S1,...]
                           [--machine-client ID:SECRET]

One process, loopback only (127.0.0.1), that is both an OAuth 2.1 authorization server (AS) and
the MCP resource server (RS) it protects. Everything is built from the SDK's public auth pieces
(`mcp.server.auth`); only the in-memory provider, the two small ASGI guards around /authorize and
/token and the admin endpoint are written here. `--port 0` (the default) lets the kernel pick a
free port. With PORT the bound port, ISSUER = http://127.0.0.1:PORT (no trailing slash) and
RS = http://127.0.0.1:PORT/mcp:

    GET  /.well-known/oauth-authorization-server      RFC 8414 AS metadata (issuer ISSUER, S256 only,
                                                      grant types authorization_code + refresh_token,
                                                      scopes_supported = --scopes, token endpoint auth
                                                      none / client_secret_post / client_secret_basic,
                                                      authorization_response_iss_parameter_supported)
    POST /register                                    RFC 7591 dynamic client registration (the SDK's
                                                      handler: auth method none / client_secret_post /
                                                      client_secret_basic; no scope -> all of --scopes)
    GET  /authorize  (POST too)                       authorization code + PKCE S256 (the SDK enforces
                                                      both); auto-approved, no login page: answers 302
                                                      to the registered redirect_uri with `code`,
                                                      `state` (if sent) and `iss` = ISSUER (RFC 9207;
                                                      error redirects get `iss` too)
    POST /token                                       authorization_code and refresh_token grants;
                                                      client_credentials for the --machine-client
                                                      (HTTP Basic or client_secret_post; no refresh
                                                      token; scope as asked, else all of --scopes)
    POST /revoke                                      RFC 7009 (drops the whole grant: access + refresh);
                                                      a public client may leave client_secret out
                                                      (the SDK's model requires the key: see below)
    GET  /.well-known/oauth-protected-resource/mcp    RFC 9728 metadata: resource RS,
                                                      authorization_servers [ISSUER],
                                                      scopes_supported = --required-scopes
    *    /mcp                                         the MCP endpoint, bearer token required
    POST /admin/revoke-all                            test hook: drop every access and refresh token,
                                                      answers 200 {"revoked": N} (N: the unexpired
                                                      access tokens plus the refresh tokens dropped);
                                                      only from a loopback peer (else 403)

The MCP endpoint serves the server object of tests/interop/modern_server.py (tools
echo/add/whoami/confirm, resource mcpmesh://interop/hello, prompt greet) over the SDK's
Streamable HTTP transport, both protocol eras, exactly as tests/interop/http_server.py does
(see there), behind the SDK's `BearerAuthBackend` (with `resource_server_url` = RS, so a token
must have been issued for RS) and `RequireAuthMiddleware` (required scopes = --required-scopes).
Refusals, as the SDK's middleware writes them:

    401 (no token, unknown, expired or revoked token)
        WWW-Authenticate: Bearer error="invalid_token", error_description="Authentication required", resource_metadata="http://127.0.0.1:PORT/.well-known/oauth-protected-resource/mcp"
    403 (valid token lacking a required scope; the SDK names the first missing one, no `scope=`)
        WWW-Authenticate: Bearer error="insufficient_scope", error_description="Required scope: mcp:read", resource_metadata="http://127.0.0.1:PORT/.well-known/oauth-protected-resource/mcp"

with a JSON body {"error": ..., "error_description": ...}.

Tokens: opaque random strings (secrets.token_urlsafe(32)), kept in memory. A token response is
the SDK's `OAuthToken`, JSON without null members:

    {"access_token": "...", "token_type": "Bearer", "expires_in": TTL, "scope": "mcp:read mcp:write", "refresh_token": "..."}

Access tokens live --token-ttl seconds (checked to the sub-second here; the SDK's backend only
checks whole seconds). Refresh tokens do not expire but ROTATE: every refresh answers a new
refresh token and the one presented stops working (a replay gets invalid_grant); the access
token issued before stays valid until it expires. A refresh may narrow the scope; the new refresh
token keeps the original scope. Authorization codes are single-use and live 300 s.

RFC 8707 `resource`: remembered with the code and the tokens; when given (at /authorize or
/token) it must be RS (compared as URLs, a trailing slash aside), else /authorize redirects back
with error=invalid_target and /token answers 400 {"error": "invalid_target", ...}. A client that
sends none gets tokens for RS (the only resource here).

Options:
    --port N               TCP port on 127.0.0.1 (default 0: pick a free one)
    --token-ttl SECS       access-token lifetime in seconds (default 3600)
    --scopes LIST          comma-separated scopes the AS supports (default mcp:read,mcp:write)
    --required-scopes LIST comma-separated scopes the RS requires (default mcp:read; "" = none)
    --machine-client ID:SECRET  a pre-registered confidential client that may use the
                           client_credentials grant (written here, not by the SDK, whose token
                           handler has no such grant)

Log: stderr, one flushed line per event; tokens, codes, PKCE verifiers/challenges, client
secrets and `state` values are never printed. Once connections are accepted, exactly once:

    listening on http://127.0.0.1:PORT/mcp

then, per HTTP request on arrival (path only, no query string; `auth` says whether an
Authorization header was sent):

    request: POST /token auth=absent

and per event:

    registered: client_id=<id> redirect_uris=["http://127.0.0.1:5555/callback"]
    authorized: client_id=<id> scopes=mcp:read,mcp:write resource=<resource as sent, or ->
    authorize refused: <error>                       (any /authorize answer carrying an error)
    token: grant=authorization_code client_id=<id> scopes=mcp:read ttl=3600
    token: grant=refresh_token client_id=<id> scopes=mcp:read ttl=3600
    token: grant=client_credentials client_id=<id> scopes=mcp:read ttl=3600
    token refused: <error> grant=<grant_type, or ->   (any non-200 /token answer)
    revoked: client_id=<id> tokens=<N>               (/revoke of a known token)
    revoked-all: <N>

Scopes in log lines are comma-separated ("-" for none).

SIGTERM/SIGINT: stop accepting, let in-flight requests finish (open streams get 2 s, then are
cancelled), run the app's shutdown (ends every MCP session) and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hmac
import json
import math
import os
import secrets
import signal
import sys
import time
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

from pydantic import AnyHttpUrl, ConfigDict, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mcp.server.auth.handlers import revoke as sdk_revoke
from mcp.server.auth.handlers.metadata import MetadataHandler
from mcp.server.auth.middleware.auth_context import AuthContextMiddleware
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    ProviderTokenVerifier,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.routes import (
    build_metadata,
    build_resource_metadata_url,
    cors_middleware,
    create_auth_routes,
    create_protected_resource_routes,
)
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modern_server  # noqa: E402  (the `mcp.run("stdio")` there is under `if __name__ == "__main__"`)
import loopback_asgi  # noqa: E402


class PublicClientRevocation(sdk_revoke.RevocationRequest):
    """The SDK's revocation request with `client_secret` optional, as RFC 7009 §5 and RFC 6749
    §2.3 have it: the SDK declares it `str | None` without a default, which pydantic reads as a
    required key, so a public client (auth method "none") or one using HTTP Basic is refused
    400 "client_secret: Field required" (modelcontextprotocol/python-sdk#3508, open). The
    handler reads the model from its module at each request, so replacing it there suffices;
    client authentication stays the SDK's own."""

    client_secret: str | None = None


sdk_revoke.RevocationRequest = PublicClientRevocation

HOST = "127.0.0.1"
PATH = "/mcp"
MAX_REQUEST_BODY = 16 * 1024 * 1024
MAX_TOKEN_REQUEST_BODY = 64 * 1024
CODE_TTL_SECONDS = 300
SUBJECT = "interop-user"  # the one resource owner who "approves" every authorization

# Like the SDK's own settings models: keep a path-less URL without a trailing slash, so the
# issuer renders as http://127.0.0.1:PORT everywhere (RFC 8414 / 9207 compare it as a string).
URL = TypeAdapter(AnyHttpUrl, config=ConfigDict(url_preserve_empty_path=True))


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def scope_list(scopes: list[str] | None) -> str:
    return ",".join(scopes) if scopes else "-"


def parse_scopes(value: str) -> list[str]:
    return [s for s in (part.strip() for part in value.split(",")) if s]


def same_resource(candidate: str, resource: str) -> bool:
    """RFC 8707 indicator check, as the SDK's BearerAuthBackend compares: as URLs, a trailing slash aside."""
    try:
        normalized = str(URL.validate_python(candidate))
    except ValidationError:
        return False
    return normalized.removesuffix("/") == resource.removesuffix("/")


class IssuedAccessToken(AccessToken):
    grant: str  # every token issued from one authorization shares it (revocation drops them together)
    expires_exact: float


class IssuedRefreshToken(RefreshToken):
    grant: str


class InMemoryProvider:
    """An `OAuthAuthorizationServerProvider` keeping clients, codes and tokens in dicts."""

    def __init__(self, issuer: str, resource: str, scopes: list[str], token_ttl: int) -> None:
        self.issuer = issuer
        self.resource = resource
        self.scopes = scopes
        self.token_ttl = token_ttl
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, IssuedAccessToken] = {}
        self.refresh: dict[str, IssuedRefreshToken] = {}

    # -- clients ------------------------------------------------------------------------------

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info
        uris = json.dumps([str(u) for u in client_info.redirect_uris or []], separators=(",", ":"))
        log(f"registered: client_id={client_info.client_id} redirect_uris={uris}")

    # -- authorization code ---------------------------------------------------------------------

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        if params.resource is not None and not same_resource(params.resource, self.resource):
            raise AuthorizeError("invalid_target", f"unknown resource; this server protects {self.resource}")
        if params.scopes is not None:
            scopes = params.scopes
        elif client.scope:
            scopes = client.scope.split()
        else:
            scopes = list(self.scopes)
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=scopes,
            expires_at=time.time() + CODE_TTL_SECONDS,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=SUBJECT,
        )
        log(f"authorized: client_id={client.client_id} scopes={scope_list(scopes)} resource={params.resource or '-'}")
        # Auto-approve: straight back to the client, with the RFC 9207 issuer.
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state, iss=self.issuer)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        code = self.codes.get(authorization_code)
        if code is None or code.client_id != client.client_id:
            return None
        return code

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        if self.codes.pop(authorization_code.code, None) is None:  # single use
            raise TokenError("invalid_grant", "authorization code already used")
        return self._issue(
            "authorization_code",
            client.client_id,
            authorization_code.scopes,
            authorization_code.scopes,
            authorization_code.resource or self.resource,
            secrets.token_hex(8),
        )

    # -- refresh ------------------------------------------------------------------------------

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> IssuedRefreshToken | None:
        token = self.refresh.get(refresh_token)
        if token is None or token.client_id != client.client_id:
            return None
        return token

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: IssuedRefreshToken, scopes: list[str]
    ) -> OAuthToken:
        if self.refresh.pop(refresh_token.token, None) is None:  # rotation: the old one is spent
            raise TokenError("invalid_grant", "refresh token already used")
        return self._issue(
            "refresh_token",
            client.client_id,
            scopes,
            refresh_token.scopes,
            refresh_token.resource or self.resource,
            refresh_token.grant,
        )

    def issue_machine(self, client_id: str, scopes: list[str], resource: str) -> OAuthToken:
        """An access token of the client_credentials grant: no refresh token."""
        token = self._issue("client_credentials", client_id, scopes, scopes, resource, secrets.token_urlsafe(8))
        self.refresh.pop(token.refresh_token or "", None)
        return token.model_copy(update={"refresh_token": None})

    def _issue(
        self, grant_type: str, client_id: str, scopes: list[str], refresh_scopes: list[str], resource: str, grant: str
    ) -> OAuthToken:
        now = time.time()
        access = secrets.token_urlsafe(32)
        refresh = secrets.token_urlsafe(32)
        self.access[access] = IssuedAccessToken(
            token=access,
            client_id=client_id,
            scopes=scopes,
            expires_at=math.ceil(now + self.token_ttl),
            resource=resource,
            subject=SUBJECT,
            claims={"iss": self.issuer},
            grant=grant,
            expires_exact=now + self.token_ttl,
        )
        self.refresh[refresh] = IssuedRefreshToken(
            token=refresh, client_id=client_id, scopes=refresh_scopes, resource=resource, subject=SUBJECT, grant=grant
        )
        log(f"token: grant={grant_type} client_id={client_id} scopes={scope_list(scopes)} ttl={self.token_ttl}")
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=self.token_ttl,
            scope=" ".join(scopes),
            refresh_token=refresh,
        )

    # -- access tokens, revocation ----------------------------------------------------------------

    async def load_access_token(self, token: str) -> IssuedAccessToken | None:
        access = self.access.get(token)
        if access is None:
            return None
        if time.time() >= access.expires_exact:
            del self.access[token]
            return None
        return access

    async def revoke_token(self, token: IssuedAccessToken | IssuedRefreshToken) -> None:
        grant = token.grant
        dropped = 0
        for store in (self.access, self.refresh):
            for key in [k for k, v in store.items() if v.grant == grant]:
                del store[key]
                dropped += 1
        log(f"revoked: client_id={token.client_id} tokens={dropped}")

    def revoke_all(self) -> int:
        now = time.time()
        # N counts the tokens that still worked: expired access tokens linger until looked up.
        dropped = sum(1 for t in self.access.values() if now < t.expires_exact) + len(self.refresh)
        self.access.clear()
        self.refresh.clear()
        log(f"revoked-all: {dropped}")
        return dropped


# -- ASGI helpers --------------------------------------------------------------------------------


async def send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"cache-control", b"no-store"),
                (b"pragma", b"no-cache"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def json_error(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error") or "-")
    except (ValueError, AttributeError):
        return "-"


class TokenGuard:
    """Around the SDK's /token endpoint: refuse a `resource` other than RS (RFC 8707
    invalid_target), answer the client_credentials grant of the machine client itself, hand
    every other request on unchanged, and log every refusal."""

    def __init__(self, app: Any, resource: str, provider: "InMemoryProvider", machine: tuple[str, str] | None) -> None:
        self.app = app
        self.resource = resource
        self.provider = provider
        self.machine = machine

    async def client_credentials(self, scope: dict[str, Any], form: list[tuple[str, str]], send: Any) -> None:
        fields = dict(form)
        client_id, secret = fields.get("client_id"), fields.get("client_secret")
        for key, value in scope.get("headers", []):
            if key == b"authorization" and value[:6].lower() == b"basic ":
                try:
                    pair = base64.b64decode(value[6:]).decode()
                except (ValueError, UnicodeDecodeError):
                    pair = ""
                user, _, password = pair.partition(":")
                client_id, secret = unquote_plus(user), unquote_plus(password)
        if self.machine is None or client_id != self.machine[0] or not hmac.compare_digest(
            (secret or "").encode(), self.machine[1].encode()
        ):
            log("token refused: invalid_client grant=client_credentials")
            await send_json(send, 401, {"error": "invalid_client", "error_description": "unknown client or wrong secret"})
            return
        asked = parse_scopes(fields.get("scope", "").replace(" ", ","))
        if any(s not in self.provider.scopes for s in asked):
            log("token refused: invalid_scope grant=client_credentials")
            await send_json(send, 400, {"error": "invalid_scope", "error_description": "unknown scope"})
            return
        token = self.provider.issue_machine(client_id, asked or self.provider.scopes, self.resource)
        await send_json(send, 200, token.model_dump(exclude_none=True))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_TOKEN_REQUEST_BODY:
                log("token refused: invalid_request grant=-")
                await send_json(send, 413, {"error": "invalid_request", "error_description": "request too large"})
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        form = parse_qsl(body.decode("latin-1"), keep_blank_values=True)
        grant = next((v for k, v in form if k == "grant_type"), "-") or "-"
        for key, value in form:
            if key == "resource" and not same_resource(value, self.resource):
                log(f"token refused: invalid_target grant={grant}")
                await send_json(
                    send,
                    400,
                    {"error": "invalid_target", "error_description": f"unknown resource; this server protects {self.resource}"},
                )
                return
        if grant == "client_credentials":
            await self.client_credentials(scope, form, send)
            return

        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        status = 0
        error_body: list[bytes] = []

        async def watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status != 200:
                error_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    log(f"token refused: {json_error(b''.join(error_body))} grant={grant}")
            await send(message)

        await self.app(scope, replay, watch)


class AuthorizeGuard:
    """Around the SDK's /authorize endpoint: make sure every redirect back to the client carries
    `iss` (RFC 9207: error responses too; the provider already adds it to a success) and log
    every refusal."""

    def __init__(self, app: Any, issuer: str) -> None:
        self.app = app
        self.issuer = issuer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        error_body: list[bytes] = []

        async def watch(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if status in (302, 303):
                    headers = []
                    for name, value in message.get("headers", []):
                        if name.lower() == b"location":
                            value = self._with_issuer(value.decode("latin-1")).encode("latin-1")
                        headers.append((name, value))
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and status >= 400:
                error_body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    log(f"authorize refused: {json_error(b''.join(error_body))}")
            await send(message)

        await self.app(scope, receive, watch)

    def _with_issuer(self, location: str) -> str:
        parts = urlsplit(location)
        query = parse_qsl(parts.query, keep_blank_values=True)
        error = next((v for k, v in query if k == "error"), None)
        if error is not None:
            log(f"authorize refused: {error}")
        if any(k == "iss" for k, _ in query):
            return location
        return urlunsplit(parts._replace(query=urlencode([*query, ("iss", self.issuer)])))


class RequestLog:
    """ASGI wrapper: one stderr line per HTTP request (method, path, whether it carried an
    Authorization header), then hand the request on unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            auth = any(name.lower() == b"authorization" for name, _ in scope.get("headers", []))
            log(f"request: {scope.get('method', '?')} {scope.get('path', '')} auth={'present' if auth else 'absent'}")
        await self.app(scope, receive, send)


def build_app(
    port: int, token_ttl: int, scopes: list[str], required_scopes: list[str], machine: tuple[str, str] | None = None
) -> Starlette:
    issuer = f"http://{HOST}:{port}"
    resource = f"{issuer}{PATH}"
    # The SDK's validate_issuer_url (in create_auth_routes) accepts plain http for
    # localhost / 127.0.0.1 / [::1]; no workaround needed.
    issuer_url = URL.validate_python(issuer)
    resource_url = URL.validate_python(resource)
    provider = InMemoryProvider(issuer, resource, scopes, token_ttl)

    registration = ClientRegistrationOptions(enabled=True, valid_scopes=scopes, default_scopes=scopes)
    revocation = RevocationOptions(enabled=True)
    # The SDK's metadata, plus the RFC 9207 flag (every redirect from /authorize carries `iss`).
    metadata = build_metadata(issuer_url, None, registration, revocation)
    metadata.authorization_response_iss_parameter_supported = True
    # The SDK's handlers accept public clients (registered with token_endpoint_auth_method
    # "none", authenticated by PKCE alone), but build_metadata does not list the method.
    metadata.token_endpoint_auth_methods_supported = ["none", "client_secret_post", "client_secret_basic"]
    if machine is not None:
        metadata.grant_types_supported = [*(metadata.grant_types_supported or []), "client_credentials"]

    routes: list[Route] = []
    for route in create_auth_routes(
        provider, issuer_url, client_registration_options=registration, revocation_options=revocation
    ):
        if route.path == "/.well-known/oauth-authorization-server":
            route = Route(
                route.path,
                endpoint=cors_middleware(MetadataHandler(metadata).handle, ["GET", "OPTIONS"]),
                methods=["GET", "OPTIONS"],
            )
        elif route.path == "/token":
            guard = TokenGuard(route.endpoint, resource, provider, machine)
            route = Route(route.path, endpoint=guard, methods=["POST", "OPTIONS"])
        elif route.path == "/authorize":
            route = Route(route.path, endpoint=AuthorizeGuard(route.endpoint, issuer), methods=["GET", "POST"])
        routes.append(route)

    routes.extend(
        create_protected_resource_routes(
            resource_url=resource_url,
            authorization_servers=[issuer_url],
            scopes_supported=required_scopes or None,
        )
    )

    async def revoke_all(request: Request) -> Response:
        client = request.client
        if client is None or client.host not in ("127.0.0.1", "::1"):
            return JSONResponse({"error": "loopback only"}, status_code=403)
        return JSONResponse({"revoked": provider.revoke_all()})

    routes.append(Route("/admin/revoke-all", endpoint=revoke_all, methods=["POST"]))

    mcp_app = modern_server.mcp.streamable_http_app(
        streamable_http_path=PATH,
        max_request_body_size=MAX_REQUEST_BODY,
        host=HOST,  # -> the SDK's loopback DNS-rebinding defaults (Host 127.0.0.1:* etc. allowed)
    )
    # The same wiring as the SDK's `Server.streamable_http_app(auth=..., token_verifier=...)`:
    # RequireAuthMiddleware in front of the MCP endpoint, the bearer backend app-wide.
    routes.append(
        Route(
            PATH,
            endpoint=RequireAuthMiddleware(mcp_app, required_scopes, build_resource_metadata_url(resource_url)),
        )
    )
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(
                AuthenticationMiddleware,
                backend=BearerAuthBackend(ProviderTokenVerifier(provider), resource_server_url=resource_url),
            ),
            Middleware(AuthContextMiddleware),
        ],
        # The MCP sub-app's own lifespan is not run when it sits behind a route: run its session
        # manager (the task group every session lives in) from here.
        lifespan=lambda app: modern_server.mcp.session_manager.run(),
    )


async def serve(
    port: int, token_ttl: int, scopes: list[str], required_scopes: list[str], machine: tuple[str, str] | None
) -> None:
    # Bound first (loopback only): the issuer and resource URLs carry the real port.
    def build(bound_port: int) -> Any:
        return RequestLog(build_app(bound_port, token_ttl, scopes, required_scopes, machine))

    await loopback_asgi.serve(port, build, PATH, log)


def main() -> int:
    parser = argparse.ArgumentParser(prog="oauth_server.py")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--token-ttl", type=int, default=3600, metavar="SECS", help="access-token lifetime (default 3600)")
    parser.add_argument("--scopes", default="mcp:read,mcp:write", help="comma-separated scopes the AS supports")
    parser.add_argument("--required-scopes", default="mcp:read", help="comma-separated scopes the RS requires")
    parser.add_argument("--machine-client", metavar="ID:SECRET", help="a client allowed the client_credentials grant")
    options = parser.parse_args()
    machine = None
    if options.machine_client:
        client_id, sep, secret = options.machine_client.partition(":")
        if not (client_id and sep and secret):
            parser.error("--machine-client takes ID:SECRET")
        machine = (client_id, secret)
    if not 0 <= options.port <= 65535:
        parser.error(f"bad port {options.port}")
    if options.token_ttl < 1:
        parser.error(f"bad --token-ttl {options.token_ttl}")
    scopes = parse_scopes(options.scopes)
    if not scopes:
        parser.error("--scopes must name at least one scope")
    required_scopes = parse_scopes(options.required_scopes)
    # As in http_server.py: uvicorn re-raises the captured signal after its graceful shutdown;
    # these no-op handlers make that harmless, so a SIGTERM ends in a normal exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        asyncio.run(serve(options.port, options.token_ttl, scopes, required_scopes, machine))
    except OSError as exc:
        log(f"oauth_server: cannot listen on {HOST}:{options.port}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
