"""A stand-in for the user's web browser in the mcpmesh OAuth interop tests (`requests`).

Usage:
    python browser.py [--stop-at-callback] URL

GETs URL and follows every redirect (301/302/303/307/308, each as a GET, at most 10 hops), the
way a browser carries an OAuth authorization request to the authorization server
(tests/interop/oauth_server.py auto-approves) and the answer back to the client's loopback
redirect URI (e.g. http://127.0.0.1:PORT/callback?code=...&state=...&iss=...). Loopback only:
every URL, the first and each redirect target, must be http(s) on 127.0.0.1 or localhost; any
other host is refused before it is contacted (exit 2). Proxy settings from the environment
are ignored. Bounded: the whole walk gets 10 s.

Log: stderr, one line per URL visited, query values elided (codes, states and challenges are
never printed), with the answer's status:

    browser: GET http://127.0.0.1:PORT/authorize?response_type=...&client_id=...&code_challenge=... -> 302
    browser: GET http://127.0.0.1:5555/callback?code=...&state=...&iss=... -> 200

--stop-at-callback: the browser of a user whose node is elsewhere (headless): the first redirect
whose path is `/callback` is not followed; its absolute URL (code and state included: it is
what the user copies into `mcpmesh auth NAME --redirect-url`) is printed on stdout, exit 0.

Exit status: 0 if the final answer is 2xx, 1 if it is anything else (or a request failed, timed
out, or redirected too often), 2 for a bad URL / a non-loopback host.
"""

from __future__ import annotations

import signal
import sys
import time
from urllib.parse import parse_qsl, urljoin, urlsplit, urlunsplit

import requests

TIMEOUT_SECONDS = 10.0
MAX_HOPS = 10
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
REDIRECTS = (301, 302, 303, 307, 308)


def elided(url: str) -> str:
    parts = urlsplit(url)
    query = "&".join(f"{key}=..." for key, _ in parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit(parts._replace(query=query, fragment="..." if parts.fragment else ""))


def loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and (parts.hostname or "").lower() in LOOPBACK_HOSTS


def walk(url: str, stop_at_callback: bool = False) -> int:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    with requests.Session() as session:
        session.trust_env = False  # no proxies, no .netrc
        for _ in range(MAX_HOPS + 1):
            if not loopback(url):
                print(f"browser: refusing non-loopback URL {elided(url)}", file=sys.stderr, flush=True)
                return 2
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                print("browser: timed out", file=sys.stderr, flush=True)
                return 1
            try:
                response = session.get(url, allow_redirects=False, timeout=remaining)
            except requests.RequestException as exc:
                print(f"browser: GET {elided(url)} failed: {type(exc).__name__}", file=sys.stderr, flush=True)
                return 1
            print(f"browser: GET {elided(url)} -> {response.status_code}", file=sys.stderr, flush=True)
            location = response.headers.get("location")
            if response.status_code in REDIRECTS and location:
                url = urljoin(url, location)
                if stop_at_callback and urlsplit(url).path == "/callback":
                    print(url, flush=True)
                    return 0
                continue
            return 0 if 200 <= response.status_code < 300 else 1
    print(f"browser: more than {MAX_HOPS} redirects", file=sys.stderr, flush=True)
    return 1


def main() -> int:
    args = sys.argv[1:]
    stop_at_callback = bool(args) and args[0] == "--stop-at-callback"
    if stop_at_callback:
        args = args[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    url = args[0]
    if not loopback(url):
        print(f"browser: refusing non-loopback URL {elided(url)}", file=sys.stderr, flush=True)
        return 2

    # Hard bound on top of the per-request timeouts (a server trickling bytes could outlast them).
    def expire(*_: object) -> None:
        print("browser: timed out", file=sys.stderr, flush=True)
        sys.exit(1)

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(int(TIMEOUT_SECONDS) + 1)
    return walk(url, stop_at_callback)


if __name__ == "__main__":
    sys.exit(main())
