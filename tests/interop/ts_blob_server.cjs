// An MCP server built on the official TypeScript SDK (the one server-everything pulls in),
// whose `blob` tool answers with a text of `bytes` bytes. The SDK writes an answer's `result`
// before its `id`, so an answer cut off at the mesh's frame cap never named its request.
// Usage: node ts_blob_server.cjs DIR, where DIR/node_modules holds the SDK (target/interop).
"use strict";
const path = require("node:path");
const { createRequire } = require("node:module");

const from = createRequire(path.resolve(process.argv[2], "package.json"));
const { McpServer } = from("@modelcontextprotocol/sdk/server/mcp.js");
const { StdioServerTransport } = from("@modelcontextprotocol/sdk/server/stdio.js");
const { z } = from("zod");

const server = new McpServer({ name: "ts-blob", version: "1.0.0" });
server.registerTool(
  "blob",
  { description: "A text of `bytes` bytes.", inputSchema: { bytes: z.number().int().min(0) } },
  async ({ bytes }) => ({ content: [{ type: "text", text: "x".repeat(bytes) }] }),
);
server.connect(new StdioServerTransport());
