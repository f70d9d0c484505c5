// Preloaded (`node --require`) into server-everything's HTTP mode by the test suites: its
// `app.listen(PORT)` would listen on every interface; this makes a bare-port listen bind
// 127.0.0.1 only, so the tests never open a port beyond loopback.
"use strict";
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const barePort = (typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port)))
    && (args.length === 1 || typeof args[1] === "function");
  if (barePort) {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
