//! `mcpmesh demo-server`: the small stdio MCP server `mcpmesh demo` shares between its two
//! nodes. It answers from memory: `echo` (the caller's `text`), `whoami` (what the node told it
//! about the caller) and `blob` (a text of `bytes` bytes). Blocking std I/O only: it starts in
//! a blink and needs no runtime.

use std::io::{BufRead, BufWriter, Write};

use serde_json::{Value, json};

/// The longest text `blob` makes.
const BLOB_MAX: u64 = 64 << 20;

/// Serves MCP over stdio, as `name`, until stdin closes.
pub fn serve_stdio(name: &str) -> std::io::Result<()> {
    // Says hello on stderr, where a node sends it to its log (never into the MCP stream).
    eprintln!("{name}: ready (pid {})", std::process::id());
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut line = Vec::new();
    let mut stdin = std::io::stdin().lock();
    loop {
        line.clear();
        if stdin.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
            if !line.iter().all(u8::is_ascii_whitespace) {
                respond(&mut out, &Value::Null, Err((-32700, "parse error".into())))?;
            }
            continue;
        };
        let (Some(id), Some(method)) = (msg.get("id"), msg.get("method").and_then(Value::as_str))
        else {
            continue; // notifications and responses need no answer
        };
        let params = msg.get("params").unwrap_or(&Value::Null);
        let result = match method {
            "initialize" => Ok(json!({
                "protocolVersion": params.get("protocolVersion").cloned().unwrap_or(json!("2025-06-18")),
                "capabilities": { "tools": {} },
                "serverInfo": { "name": name, "version": env!("CARGO_PKG_VERSION") },
            })),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({ "tools": tool_list() })),
            "tools/call" => call_tool(params),
            _ => Err((-32601, format!("method not found: {method}"))),
        };
        respond(&mut out, id, result)?;
    }
}

fn tool_list() -> Value {
    json!([
        { "name": "echo", "description": "Echoes `text` back.",
          "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } } } },
        { "name": "whoami", "description": "Who the mesh says is calling.",
          "inputSchema": { "type": "object" } },
        { "name": "blob", "description": "Returns a text of `bytes` bytes.",
          "inputSchema": { "type": "object", "properties": { "bytes": { "type": "integer" } } } },
    ])
}

fn call_tool(params: &Value) -> Result<Value, (i64, String)> {
    let args = params.get("arguments").unwrap_or(&Value::Null);
    let text_result = |text: String| json!({ "content": [{ "type": "text", "text": text }] });
    match params.get("name").and_then(Value::as_str).unwrap_or("echo") {
        "echo" => {
            let text = args.get("text").and_then(Value::as_str).unwrap_or_default();
            let mut result = text_result(text.to_owned());
            result["peer_name"] =
                std::env::var("MCPMESH_PEER_NAME").map_or(Value::Null, Value::from);
            Ok(result)
        }
        "whoami" => {
            // The identity the node set in this server's environment, and the one it wrote
            // into the request (what a server on a socket would read).
            let mut seen: serde_json::Map<String, Value> = std::env::vars()
                .filter(|(k, _)| k.starts_with("MCPMESH_"))
                .map(|(k, v)| (k, Value::from(v)))
                .collect();
            seen.insert("pid".into(), Value::from(std::process::id()));
            let meta_peer = params.pointer("/_meta/mcpmesh~1peer").cloned();
            seen.insert("meta_peer".into(), meta_peer.unwrap_or(Value::Null));
            let mut result = text_result(Value::Object(seen.clone()).to_string());
            result["structuredContent"] = Value::Object(seen);
            Ok(result)
        }
        "blob" => {
            let n = args.get("bytes").and_then(Value::as_u64).unwrap_or(0);
            Ok(text_result("x".repeat(n.min(BLOB_MAX) as usize)))
        }
        other => Err((-32602, format!("unknown tool: {other}"))),
    }
}

fn respond(
    out: &mut impl Write,
    id: &Value,
    result: Result<Value, (i64, String)>,
) -> std::io::Result<()> {
    let msg = match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err((code, message)) => {
            json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
        }
    };
    serde_json::to_writer(&mut *out, &msg)?;
    out.write_all(b"\n")?;
    out.flush()
}
