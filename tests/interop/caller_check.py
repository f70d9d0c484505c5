"""Verifying mcpmesh's signed caller assertion with PyJWT, as a server of a `url` or `socket`
service would (tests/interop/http_server.py and socket_server.py, option --jwks).

CallerCheck(jwks_file, audience).claims(token) returns the claims of a valid assertion and
raises a jwt.PyJWTError otherwise: EdDSA only, `kid` found in the pinned JWKS (`mcpmesh id
--jwks`), `iss` = "eid:" + kid, `aud` = `audience` exactly, `exp`/`iat`/`iss`/`sub`/`aud`/`jti`
present, not expired (no leeway). A missing token raises jwt.InvalidTokenError("no assertion").
"""

from __future__ import annotations

import json
from typing import Any

import jwt


class CallerCheck:
    """Verifies mcpmesh caller assertions against a pinned JWKS, for one audience."""

    def __init__(self, jwks_file: str, audience: str) -> None:
        with open(jwks_file, encoding="utf-8") as f:
            self.keys = jwt.PyJWKSet.from_dict(json.load(f))
        self.audience = audience

    def claims(self, token: str | None) -> dict[str, Any]:
        if not token:
            raise jwt.InvalidTokenError("no assertion")
        kid = jwt.get_unverified_header(token).get("kid")
        try:
            key = self.keys[kid]
        except KeyError:
            raise jwt.InvalidKeyError(f"unknown key id {kid!r}") from None
        return jwt.decode(
            token,
            key=key.key,
            algorithms=["EdDSA"],
            audience=self.audience,
            issuer=f"eid:{kid}",
            options={"require": ["exp", "iat", "iss", "sub", "aud", "jti"]},
        )
