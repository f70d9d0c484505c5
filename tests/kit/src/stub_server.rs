//! `echo_mcp_stub`'s MCP server: tiny and fast, answering from memory, the suites' and
//! benchmarks' child server. Blocking std I/O only, so it starts fast and adds nothing to what
//! it measures.

use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

/// Serves MCP over stdio until stdin closes. Tools: `echo` (also the default for a call
/// without a name; reports the caller's `MCPMESH_PEER_NAME` as `peer_name`), `whoami` (the
/// identity env the node set, the request's `_meta["mcpmesh/peer"]`, and the server's pid),
/// `blob` (a text of `bytes` bytes), `crash` (exits mid-call), `size` (the length of `text`),
/// `sleep` (answers after `ms`), `trickle` (a long text, slowly) and `ask` (a request to the
/// client before the answer).
pub fn serve_stdio(name: &str) -> std::io::Result<()> {
    // Says hello on stderr, where a node sends it to its log (never into the MCP stream).
    eprintln!("{name}: ready (pid {})", std::process::id());
    let stdin = BufReader::with_capacity(256 * 1024, std::io::stdin().lock());
    let stdout = BufWriter::with_capacity(256 * 1024, std::io::stdout().lock());
    serve(stdin, stdout, name, None)
}

/// Serves MCP on a Unix socket, one session per connection (each on its own thread), until
/// killed: a long-running server for the `socket` backend. With `record`, every line each
/// session receives is appended to that file as it arrived.
pub fn serve_socket(path: &Path, name: &str, record: Option<&Path>) -> std::io::Result<()> {
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    eprintln!(
        "{name}: listening on {} (pid {})",
        path.display(),
        std::process::id()
    );
    let record = match record {
        Some(p) => Some(std::sync::Arc::new(std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        ))),
        None => None,
    };
    for conn in listener.incoming() {
        let conn = conn?;
        let (name, record) = (name.to_owned(), record.clone());
        std::thread::spawn(move || {
            let reader = BufReader::new(conn.try_clone()?);
            serve(reader, BufWriter::new(conn), &name, record.as_deref())
        });
    }
    Ok(())
}

fn serve(
    mut reader: impl BufRead,
    mut out: impl Write,
    name: &str,
    record: Option<&std::sync::Mutex<std::fs::File>>,
) -> std::io::Result<()> {
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if let Some(file) = record {
            file.lock()
                .unwrap_or_else(|p| p.into_inner())
                .write_all(&line)?;
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
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        // A call that asks for progress hears that it started, before any work is done.
        if let Some(token) = params.pointer("/_meta/progressToken") {
            let note = json!({ "jsonrpc": "2.0", "method": "notifications/progress",
                               "params": { "progressToken": token, "progress": 0 } });
            serde_json::to_writer(&mut out, &note)?;
            out.write_all(b"\n")?;
            out.flush()?;
        }
        // `ask` puts a question to the client (a server→client request) before answering.
        if method == "tools/call" && params.get("name").and_then(Value::as_str) == Some("ask") {
            let ask = json!({ "jsonrpc": "2.0", "id": "ask-1", "method": "roots/list" });
            serde_json::to_writer(&mut out, &ask)?;
            out.write_all(b"\n")?;
            out.flush()?;
        }
        if method == "tools/call" && params.get("name").and_then(Value::as_str) == Some("trickle") {
            trickle(
                &mut out,
                id,
                params.get("arguments").unwrap_or(&Value::Null),
            )?;
            continue;
        }
        let result = match method {
            "initialize" => Ok(json!({
                "protocolVersion": params.get("protocolVersion").cloned().unwrap_or(json!("2025-06-18")),
                "capabilities": { "tools": {} },
                "serverInfo": { "name": name, "version": env!("CARGO_PKG_VERSION") },
            })),
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({ "tools": tool_list() })),
            "tools/call" => call_tool(&params),
            _ => Err((-32601, format!("method not found: {method}"))),
        };
        respond(&mut out, id, result)?;
    }
}

fn tool_list() -> Vec<Value> {
    let text_schema = json!({ "type": "object", "properties": { "text": { "type": "string" } } });
    vec![
        json!({ "name": "echo", "description": "Echoes `text` back.", "inputSchema": text_schema }),
        json!({ "name": "whoami", "description": "Who the mesh says is calling.", "inputSchema": { "type": "object" } }),
        json!({ "name": "blob", "description": "Returns a text of `bytes` bytes.",
                "inputSchema": { "type": "object", "properties": { "bytes": { "type": "integer" } } } }),
        json!({ "name": "crash", "description": "Exits without answering.", "inputSchema": { "type": "object" } }),
        json!({ "name": "size", "description": "Returns the length of `text` in bytes.",
                "inputSchema": { "type": "object", "properties": { "text": { "type": "string" } } } }),
        json!({ "name": "sleep", "description": "Answers after `ms` milliseconds.",
                "inputSchema": { "type": "object", "properties": { "ms": { "type": "integer" } } } }),
        json!({ "name": "trickle", "description": "Returns a text of `bytes` bytes, 64 KiB every `ms` milliseconds.",
                "inputSchema": { "type": "object", "properties": { "bytes": { "type": "integer" }, "ms": { "type": "integer" } } } }),
        json!({ "name": "ask", "description": "Asks the client for its roots (id \"ask-1\"), then answers.",
                "inputSchema": { "type": "object" } }),
    ]
}

fn call_tool(params: &Value) -> Result<Value, (i64, String)> {
    let args = params.get("arguments").cloned().unwrap_or(Value::Null);
    let text_result = |text: String| json!({ "content": [{ "type": "text", "text": text }] });
    match params.get("name").and_then(Value::as_str).unwrap_or("echo") {
        "echo" => {
            let mut result = text_result(
                args.get("text")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
            );
            result["peer_name"] =
                std::env::var("MCPMESH_PEER_NAME").map_or(Value::Null, Value::from);
            Ok(result)
        }
        "whoami" => {
            let mut env: serde_json::Map<String, Value> = std::env::vars()
                .filter(|(k, _)| k.starts_with("MCPMESH_"))
                .map(|(k, v)| (k, Value::from(v)))
                .collect();
            env.insert("pid".into(), Value::from(std::process::id()));
            let meta_peer = params.pointer("/_meta/mcpmesh~1peer").cloned();
            env.insert("meta_peer".into(), meta_peer.unwrap_or(Value::Null));
            let mut result = text_result(Value::Object(env.clone()).to_string());
            result["structuredContent"] = Value::Object(env);
            Ok(result)
        }
        "blob" => {
            let n = args
                .get("bytes")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(64 << 20) as usize;
            Ok(text_result("x".repeat(n)))
        }
        "crash" => std::process::exit(3),
        "size" => {
            let n = args.get("text").and_then(Value::as_str).map_or(0, str::len);
            Ok(text_result(n.to_string()))
        }
        "sleep" => {
            let ms = args
                .get("ms")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(60_000);
            std::thread::sleep(Duration::from_millis(ms));
            Ok(text_result(format!("slept {ms} ms")))
        }
        "ask" => Ok(text_result("asked".to_owned())),
        other => Err((-32602, format!("unknown tool: {other}"))),
    }
}

/// Answers with a text of `bytes` bytes written 64 KiB at a time, `ms` apart: a long answer
/// produced slowly, still on its way while the test does something else.
fn trickle(out: &mut impl Write, id: &Value, args: &Value) -> std::io::Result<()> {
    let arg = |name: &str, most: u64| {
        args.get(name)
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(most)
    };
    let (mut left, ms) = (arg("bytes", 64 << 20) as usize, arg("ms", 1_000));
    write!(
        out,
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":""#
    )?;
    let chunk = vec![b'x'; 64 * 1024];
    while left > 0 {
        let n = left.min(chunk.len());
        out.write_all(&chunk[..n])?;
        out.flush()?;
        left -= n;
        std::thread::sleep(Duration::from_millis(ms));
    }
    out.write_all(b"\"}]}}\n")?;
    out.flush()
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
