//! What a node needs to know of a line too long to hold whole, gathered as the line streams by.
//!
//! A node passes a long line on as it arrives ([`crate::pump::forward`]) and still has to know
//! which request it answers and how. [`Skeleton`] scans the parts in order and keeps a small
//! JSON object: each top-level member that is small, whole; of a large member whose value is
//! an object, that object's small members; of any other large member, the key with `null`.
//! Peeking at the skeleton ([`crate::jsonrpc`]) finds the same id, method and outcome as
//! peeking at the whole line whenever those members are small, as they are in real messages:
//! a large message is large because of its `result`, `params` or `error.data`.

/// A member up to this size (key, colon and value, as written) is kept whole.
const SMALL: usize = 4 * 1024;
/// Longer keys are never ones a decision looks at.
const MAX_KEY: usize = 256;
/// What the skeleton of one line may hold at most, members of a large object included.
const MAX_SKELETON: usize = 64 * 1024;

/// The small members of one top-level JSON object, gathered from its bytes in parts.
#[derive(Debug, Default)]
pub struct Skeleton {
    /// Kept top-level members, comma-separated.
    out: Vec<u8>,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The top-level object has ended; only whitespace may follow.
    closed: bool,
    /// Not one JSON object (as far as a structural scan can tell).
    broken: bool,
    /// The top-level member being read.
    top: Member,
    /// Inside the object that is `top`'s value: the member of it being read.
    inner: Option<Member>,
    /// `top`'s value's small members, kept for when `top` turns out large.
    kept_inner: Vec<u8>,
}

/// One member as it streams by: its bytes while they stay small, its key once seen.
#[derive(Debug, Default)]
struct Member {
    raw: Vec<u8>,
    /// Grew past [`SMALL`]: `raw` was let go.
    large: bool,
    /// The key as written, once its colon has passed (when it is short).
    key: Option<Vec<u8>>,
    colon: bool,
    value_started: bool,
    value_is_object: bool,
}

impl Member {
    fn push(&mut self, bytes: &[u8]) {
        if self.large {
            return;
        }
        if self.raw.len() + bytes.len() > SMALL {
            self.large = true;
            self.raw = Vec::new();
        } else {
            self.raw.extend_from_slice(bytes);
        }
    }
}

impl Skeleton {
    /// Scans the next part of the line.
    pub fn feed(&mut self, mut part: &[u8]) {
        while !part.is_empty() && !self.broken {
            if self.in_string {
                // Inside a string only a quote or a backslash matters: skip to the next one.
                if self.escaped {
                    self.escaped = false;
                    self.capture(&part[..1]);
                    part = &part[1..];
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', part) {
                    None => {
                        self.capture(part);
                        part = &[];
                    }
                    Some(i) => {
                        self.capture(&part[..=i]);
                        if part[i] == b'\\' {
                            self.escaped = true;
                        } else {
                            self.in_string = false;
                        }
                        part = &part[i + 1..];
                    }
                }
                continue;
            }
            self.structural(part[0]);
            part = &part[1..];
        }
    }

    /// The skeleton as one JSON object, when the line was one complete object.
    pub fn finish(&self) -> Option<Vec<u8>> {
        if !self.closed || self.in_string {
            return None;
        }
        self.so_far()
    }

    /// The members that have ended so far, as one JSON object: what a line that was cut off
    /// before its end still tells (`None` when it was not the start of one JSON object).
    pub fn so_far(&self) -> Option<Vec<u8>> {
        if self.broken || (self.depth == 0 && !self.closed) {
            return None;
        }
        let mut skeleton = Vec::with_capacity(self.out.len() + 2);
        skeleton.push(b'{');
        skeleton.extend_from_slice(&self.out);
        skeleton.push(b'}');
        Some(skeleton)
    }

    /// The key, as written (quotes included), of the top-level member still being read: what
    /// a line cut off inside its large member was about (`"result"` for an answer that puts its
    /// result before its id, as the TypeScript SDK does).
    pub fn open_key(&self) -> Option<&[u8]> {
        if self.broken || self.closed || self.depth == 0 {
            return None;
        }
        self.top.key.as_deref()
    }

    fn structural(&mut self, b: u8) {
        if b.is_ascii_whitespace() {
            self.capture(&[b]);
            return;
        }
        if self.closed || (self.depth == 0 && b != b'{') {
            self.broken = true;
            return;
        }
        match b {
            b'{' if self.depth == 0 => self.depth = 1,
            b'{' | b'[' => {
                self.value_starts(b);
                self.capture(&[b]);
                self.depth += 1;
                if self.depth == 2 && self.top.value_is_object {
                    self.inner = Some(Member::default());
                }
            }
            b'}' | b']' if self.depth == 1 => {
                self.end_top();
                self.depth = 0;
                self.closed = true;
            }
            b'}' | b']' => {
                if self.depth == 2 && self.top.value_is_object {
                    self.end_inner();
                    self.inner = None;
                }
                self.capture(&[b]);
                self.depth -= 1;
            }
            b',' if self.depth == 1 => self.end_top(),
            b',' if self.depth == 2 && self.inner.is_some() => {
                self.end_inner();
                self.top.push(b",");
                self.inner = Some(Member::default());
            }
            b':' if self.depth == 1 && !self.top.colon => {
                self.top.colon = true;
                if !self.top.large && self.top.raw.len() <= MAX_KEY {
                    self.top.key = Some(self.top.raw.trim_ascii().to_vec());
                }
                self.capture(&[b]);
            }
            _ => {
                self.value_starts(b);
                if b == b'"' {
                    self.in_string = true;
                }
                self.capture(&[b]);
            }
        }
    }

    /// Notes the first byte of a top-level member's value.
    fn value_starts(&mut self, b: u8) {
        if self.depth == 1 && self.top.colon && !self.top.value_started {
            self.top.value_started = true;
            self.top.value_is_object = b == b'{';
        }
    }

    fn capture(&mut self, bytes: &[u8]) {
        if self.depth == 0 {
            return;
        }
        self.top.push(bytes);
        if self.depth >= 2
            && let Some(inner) = &mut self.inner
        {
            inner.push(bytes);
        }
    }

    fn end_inner(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let raw = inner.raw.trim_ascii();
        if inner.large || raw.is_empty() || self.kept_inner.len() + raw.len() + 1 > MAX_SKELETON {
            return;
        }
        if !self.kept_inner.is_empty() {
            self.kept_inner.push(b',');
        }
        self.kept_inner.extend_from_slice(raw);
    }

    fn end_top(&mut self) {
        let top = std::mem::take(&mut self.top);
        let kept_inner = std::mem::take(&mut self.kept_inner);
        self.inner = None;
        let member = if !top.large {
            top.raw.trim_ascii().to_vec()
        } else if let Some(key) = top.key {
            let mut m = key;
            if top.value_is_object {
                m.extend_from_slice(b":{");
                m.extend_from_slice(&kept_inner);
                m.push(b'}');
            } else {
                m.extend_from_slice(b":null");
            }
            m
        } else {
            return;
        };
        if member.is_empty() || self.out.len() + member.len() + 1 > MAX_SKELETON {
            return;
        }
        if !self.out.is_empty() {
            self.out.push(b',');
        }
        self.out.extend_from_slice(&member);
    }
}

/// The skeleton of a whole line (what [`Skeleton::feed`] builds from its parts).
pub fn of(line: &[u8]) -> Option<Vec<u8>> {
    let mut s = Skeleton::default();
    s.feed(line);
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{self, Kind, Outcome};
    use serde_json::{Value, json};

    #[test]
    fn the_member_being_read_is_named_until_it_ends() {
        let mut s = Skeleton::default();
        s.feed(br#"{"result":{"content":[{"text":"xx"#);
        assert_eq!(s.open_key(), Some(&br#""result""#[..]));
        s.feed(br#"x"}]},"jsonrpc":"2.0""#);
        assert_eq!(s.open_key(), Some(&br#""jsonrpc""#[..]));
        s.feed(br#","id":1}"#);
        assert_eq!(s.open_key(), None, "the object ended");
        let mut not_an_object = Skeleton::default();
        not_an_object.feed(br#"["result":"#);
        assert_eq!(not_an_object.open_key(), None);
    }

    fn big(n: usize) -> String {
        "é\\\"{[,:".repeat(n / 9)
    }

    /// The skeleton built from every split of `line` into two parts, and into bytes.
    fn same_in_every_split(line: &[u8]) -> Option<Vec<u8>> {
        let whole = of(line);
        for cut in 0..=line.len() {
            let mut s = Skeleton::default();
            s.feed(&line[..cut]);
            s.feed(&line[cut..]);
            assert_eq!(s.finish(), whole, "split at {cut}");
        }
        let mut s = Skeleton::default();
        for b in line {
            s.feed(std::slice::from_ref(b));
        }
        assert_eq!(s.finish(), whole, "byte by byte");
        whole
    }

    #[test]
    fn a_small_message_keeps_all_its_members() {
        let line =
            br#" { "jsonrpc" : "2.0", "id":"a\"b" , "method":"x","params":{"k":[1,{"z":2}]} } "#;
        let skeleton = same_in_every_split(line).unwrap();
        let (full, kept): (Value, Value) = (
            serde_json::from_slice(line).unwrap(),
            serde_json::from_slice(&skeleton).unwrap(),
        );
        assert_eq!(full, kept);
    }

    #[test]
    fn a_large_result_keeps_the_id_wherever_it_is_and_the_outcome() {
        for (line, id, outcome) in [
            (
                json!({"result": {"content": [{"type": "text", "text": big(50_000)}], "isError": true}, "jsonrpc": "2.0", "id": 7}),
                "7",
                Outcome::ToolError,
            ),
            (
                json!({"jsonrpc": "2.0", "id": "x", "result": {"content": [{"text": big(50_000)}]}}),
                "\"x\"",
                Outcome::Ok,
            ),
            (
                json!({"jsonrpc": "2.0", "error": {"data": big(50_000), "code": -32001, "message": "m"}, "id": 3}),
                "3",
                Outcome::Error(-32001),
            ),
            (
                json!({"jsonrpc": "2.0", "result": big(50_000), "id": 4}),
                "4",
                Outcome::Ok,
            ),
        ] {
            let line = serde_json::to_vec(&line).unwrap();
            let skeleton = of(&line).unwrap();
            assert!(
                skeleton.len() < 200,
                "{}",
                String::from_utf8_lossy(&skeleton)
            );
            let peek = jsonrpc::peek_response(&skeleton).unwrap();
            assert_eq!(peek.answers().unwrap().get(), id);
            assert_eq!(peek.outcome(), outcome);
        }
    }

    #[test]
    fn a_large_request_keeps_its_kind_id_and_small_params() {
        let line = serde_json::to_vec(&json!({
            "jsonrpc": "2.0", "method": "tools/call", "id": 12,
            "params": {"arguments": {"blob": big(40_000)}, "name": "echo"},
        }))
        .unwrap();
        let skeleton = of(&line).unwrap();
        let peek = jsonrpc::peek(&skeleton).unwrap();
        assert_eq!(peek.kind(), Kind::Request);
        assert_eq!(peek.id.unwrap().get(), "12");
        assert_eq!(
            jsonrpc::subject_name(peek.params.unwrap()).as_deref(),
            Some("echo")
        );
    }

    #[test]
    fn what_is_not_one_complete_object_has_no_skeleton() {
        for line in [
            &b"[1,2]"[..],
            b"{\"a\":1",
            b"{\"a\":\"1}",
            b"{\"a\":1} x",
            b"{\"a\":1}{}",
            b"\"s\"",
            b"",
        ] {
            assert_eq!(
                same_in_every_split(line),
                None,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(same_in_every_split(b"{}").as_deref(), Some(&b"{}"[..]));
    }

    #[test]
    fn the_skeleton_stays_small_whatever_the_line() {
        let many: String = (0..20_000).map(|i| format!("\"k{i}\":{i},")).collect();
        let line = format!("{{{many}\"id\":1}}");
        let skeleton = of(line.as_bytes()).unwrap();
        assert!(skeleton.len() <= MAX_SKELETON + 2);
    }
}
