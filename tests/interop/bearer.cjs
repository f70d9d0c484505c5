// Preloaded (`node --require`) into the conformance suite by conformance.sh when
// CONFORMANCE_BEARER_TOKEN is set: the suite has no option for request headers, and an
// endpoint such as `mcpmesh gateway` wants `Authorization: Bearer <token>` on every request.
// Every `fetch` to the origin of CONFORMANCE_URL then carries it, unless the request sets its
// own (the SDK client and the suite's raw requests both use the global `fetch`). The token is
// read from the environment, never from the command line, and is not printed.
"use strict";
const token = process.env.CONFORMANCE_BEARER_TOKEN;
const origin = new URL(process.env.CONFORMANCE_URL).origin;
const plainFetch = globalThis.fetch;
globalThis.fetch = function (input, init) {
  const request = input instanceof Request ? input : null;
  const url = new URL(request ? request.url : String(input));
  if (url.origin !== origin) {
    return plainFetch(input, init);
  }
  const headers = new Headers(init?.headers ?? request?.headers);
  if (!headers.has("authorization")) {
    headers.set("authorization", `Bearer ${token}`);
  }
  return plainFetch(input, { ...init, headers });
};
