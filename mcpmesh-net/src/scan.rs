//! A long line from the client, read as it streams by: checked as strictly as a peek at the
//! whole line would check it, and reduced to what a decision on it reads.
//!
//! The serving node decides on every line its caller sends (rate, in-flight cap, per-tool
//! rules, the audit record). A line short enough to hold is peeked at whole
//! ([`crate::jsonrpc::peek`]). A longer one goes on to the server in parts as it arrives, and
//! [`Scan`] keeps, in order and whole, the members such a peek reads: the top-level `id` and
//! `method`, `params` when it is not an object, and of an object `params` its `name`, `uri`,
//! `cursor`, `_meta`, `requestId` and `progressToken`. Everything else (a call's `arguments`)
//! is checked and let go. It also hashes `params` as written, as the audit record does.
//!
//! A peek at [`Gist::object`] decides as a peek at the whole line would: it holds the same
//! members in the same order, duplicates included, and a line a strict parser refuses is
//! refused here too, so a server with a laxer parser cannot be made to read a member this scan
//! did not. The caller holds back the top-level value's closing bracket ([`Scan::feed`] says
//! where it is) until it has decided: a refused line ends without it, and no parser takes what
//! went on for a message.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use crate::jsonrpc;

/// How a line scanned in parts ended.
#[derive(Debug)]
pub enum Scanned {
    /// One JSON object.
    Object(Gist),
    /// Well-formed JSON, but an array (a batch), not one message.
    NotAnObject,
    /// Not JSON.
    Broken,
    /// It ended inside its value: a line cut off upstream at the frame cap (the node that cut
    /// it answered it).
    Unclosed,
}

/// What a decision on a long line reads of it.
#[derive(Debug)]
pub struct Gist {
    /// The members a peek reads, in order, as one JSON object.
    pub object: Vec<u8>,
    /// BLAKE3 of the `params` value as written, when it has one (`null` included, which a
    /// peek reads as no `params`).
    pub params_hash: Option<blake3::Hash>,
    /// Whether a member at the top level or of an object `params` is spelled like one MCP
    /// reads there without being it ([`smuggles`]).
    pub smuggles: bool,
}

/// What becomes of the member whose key was just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interest {
    Skip,
    Keep,
    Params,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Value,
    /// After `[`.
    ValueOrEnd,
    /// After `{`.
    KeyOrEnd,
    /// After a `,` in an object.
    Key,
    Colon,
    CommaOrEnd,
    /// The top-level value has ended: only whitespace may follow.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Number {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    /// Inside a string; `key` when it is an object's key.
    Str {
        key: bool,
    },
    /// After a backslash in a string.
    Escape {
        key: bool,
    },
    /// Inside a `\u` escape, with this many hex digits to go.
    Hex {
        key: bool,
        left: u8,
    },
    Num(Number),
    Word {
        word: &'static [u8],
        at: usize,
    },
}

/// A member being kept: where in the current part its value's bytes start.
#[derive(Debug)]
struct Keeping {
    depth: usize,
    from: usize,
    inner: bool,
}

/// One line's scan, fed its parts in order.
#[derive(Debug)]
pub struct Scan {
    /// `true` for an object, `false` for an array: no deeper than the line is long, which the
    /// frame cap bounds.
    stack: Vec<bool>,
    expect: Expect,
    token: Token,
    broken: bool,
    /// The key being read, as written, where a peek decodes keys: the top level and an
    /// object `params` (bounded by the line, as the rest).
    key: Vec<u8>,
    /// What the key just read asks for its value.
    interest: Interest,
    /// The member being kept: its key and value so far.
    member: Vec<u8>,
    keeping: Option<Keeping>,
    /// Kept top-level members, comma-separated.
    top: Vec<u8>,
    /// Inside an object `params`: its key as written, and its kept members.
    params: Option<(Vec<u8>, Vec<u8>)>,
    hasher: Option<(blake3::Hasher, usize)>,
    params_hash: Option<blake3::Hash>,
    is_object: bool,
    smuggles: bool,
    /// Reads only how keys are spelled ([`smuggles`]): keeps and hashes nothing.
    spelling_only: bool,
}

impl Default for Scan {
    fn default() -> Self {
        Scan {
            stack: Vec::new(),
            expect: Expect::Value,
            token: Token::None,
            broken: false,
            key: Vec::new(),
            interest: Interest::Skip,
            member: Vec::new(),
            keeping: None,
            top: Vec::new(),
            params: None,
            hasher: None,
            params_hash: None,
            is_object: false,
            smuggles: false,
            spelling_only: false,
        }
    }
}

/// Whether a member of `line`'s top level, or of its object `params`, is spelled like one
/// MCP reads there without being it ([`jsonrpc::spelled_like`]). A server whose parser ignores
/// case reads such a line as another message than the one decided on (`"name":"allowed",
/// "Name":"denied"` calls `denied` there), so a serving node refuses it. Read as a long line
/// streaming by is ([`Gist::smuggles`]), so that both tell the same of any line; `false` for
/// what is not a JSON object.
pub fn smuggles(line: &[u8]) -> bool {
    // A key spelled like one MCP reads without being it has, somewhere in the line, an upper
    // case letter, an escape or a byte outside ASCII — or is `requestid` or `progresstoken`
    // (the two keys with an upper case letter, in lower case). Most lines are passed on here.
    // The two finders are built once: building one costs more than a short line's search.
    static REQUEST_ID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"requestid"));
    static PROGRESS_TOKEN: LazyLock<Finder<'static>> =
        LazyLock::new(|| Finder::new(b"progresstoken"));
    let may = line
        .iter()
        .any(|&b| b.is_ascii_uppercase() || b == b'\\' || !b.is_ascii())
        || REQUEST_ID.find(line).is_some()
        || PROGRESS_TOKEN.find(line).is_some();
    if !may {
        return false;
    }
    let mut scan = Scan {
        spelling_only: true,
        ..Scan::default()
    };
    scan.feed(line);
    !scan.broken && scan.smuggles
}

impl Scan {
    /// Scans the next part; `Some(i)` when `part[i]` ends the top-level value (its closing
    /// bracket), the byte to hold back until the line is decided on.
    pub fn feed(&mut self, part: &[u8]) -> Option<usize> {
        if let Some(k) = &mut self.keeping {
            k.from = 0;
        }
        if let Some((_, from)) = &mut self.hasher {
            *from = 0;
        }
        let mut closed_at = None;
        let mut i = 0;
        while i < part.len() && !self.broken {
            i = match self.token {
                Token::Str { key } => self.string(part, i, key),
                Token::Escape { key } => self.escape(part, i, key),
                Token::Hex { key, left } => self.hex(part, i, key, left),
                Token::Num(n) => self.number(part, i, n),
                Token::Word { word, at } => self.word(part, i, word, at),
                Token::None => {
                    let closed = self.structural(part, i);
                    if closed && self.stack.is_empty() {
                        closed_at = Some(i);
                    }
                    i + 1
                }
            };
        }
        if !self.broken {
            if let Some(k) = &self.keeping {
                self.member.extend_from_slice(&part[k.from..]);
            }
            if let Some((hasher, from)) = &mut self.hasher {
                hasher.update(&part[*from..]);
            }
        }
        closed_at
    }

    /// Whether the line has shown itself not to be JSON.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Whether a member so far is spelled like one MCP reads without being it.
    pub fn smuggles(&self) -> bool {
        self.smuggles
    }

    /// Whether the top-level value has ended.
    pub fn closed(&self) -> bool {
        self.expect == Expect::Done
    }

    /// The top-level members kept so far, as one JSON object: what a line cut off at the cap
    /// still tells (its id).
    pub fn so_far(&self) -> Vec<u8> {
        [&b"{"[..], &self.top, b"}"].concat()
    }

    /// What the line has shown so far, as one JSON object: the members kept, and an open
    /// object `params` closed after the members it kept so far. A member still to come may
    /// change what a decision reads (a doubled key); a look ahead on this only sorts out what
    /// is to be held whole and decided on as it ends.
    pub fn ahead(&self) -> Vec<u8> {
        let mut members = self.top.clone();
        if let Some((key, inner)) = &self.params {
            push_member(&mut members, &[&key[..], b":{", inner, b"}"].concat());
        }
        [&b"{"[..], &members, b"}"].concat()
    }

    /// How the line ended, once all of it was fed.
    pub fn finish(self) -> Scanned {
        if self.broken {
            Scanned::Broken
        } else if !self.closed() {
            Scanned::Unclosed
        } else if !self.is_object {
            Scanned::NotAnObject
        } else {
            Scanned::Object(Gist {
                object: self.so_far(),
                params_hash: self.params_hash,
                smuggles: self.smuggles,
            })
        }
    }

    fn string(&mut self, part: &[u8], i: usize, key: bool) -> usize {
        let rest = &part[i..];
        let stop = memchr::memchr2(b'"', b'\\', rest);
        let span = &rest[..stop.unwrap_or(rest.len())];
        if span.iter().any(|&b| b < 0x20) {
            self.broken = true;
            return part.len();
        }
        if key {
            self.key_push(span);
        }
        let Some(at) = stop else {
            return part.len();
        };
        if key {
            self.key_push(&rest[at..=at]);
        }
        let next = i + at + 1;
        if rest[at] == b'\\' {
            self.token = Token::Escape { key };
        } else if key {
            self.token = Token::None;
            self.key_done();
        } else {
            self.token = Token::None;
            self.value_done(part, next);
        }
        next
    }

    fn escape(&mut self, part: &[u8], i: usize, key: bool) -> usize {
        let b = part[i];
        self.token = match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Token::Str { key },
            b'u' => Token::Hex { key, left: 4 },
            _ => {
                self.broken = true;
                return part.len();
            }
        };
        if key {
            self.key_push(&[b]);
        }
        i + 1
    }

    fn hex(&mut self, part: &[u8], i: usize, key: bool, left: u8) -> usize {
        let b = part[i];
        if !b.is_ascii_hexdigit() {
            self.broken = true;
            return part.len();
        }
        if key {
            self.key_push(&[b]);
        }
        self.token = match left {
            1 => Token::Str { key },
            left => Token::Hex {
                key,
                left: left - 1,
            },
        };
        i + 1
    }

    /// One byte of a number, or the byte after it (which ends it and is read again).
    fn number(&mut self, part: &[u8], i: usize, n: Number) -> usize {
        let b = part[i];
        let digit = b.is_ascii_digit();
        let next = match (n, b) {
            (Number::Minus, b'0') => Some(Number::Zero),
            (Number::Minus, _) if digit => Some(Number::Int),
            (Number::Int, _) if digit => Some(Number::Int),
            (Number::Zero | Number::Int, b'.') => Some(Number::Dot),
            (Number::Dot | Number::Frac, _) if digit => Some(Number::Frac),
            (Number::Zero | Number::Int | Number::Frac, b'e' | b'E') => Some(Number::E),
            (Number::E, b'+' | b'-') => Some(Number::ESign),
            (Number::E | Number::ESign | Number::Exp, _) if digit => Some(Number::Exp),
            _ => None,
        };
        match next {
            Some(n) => {
                self.token = Token::Num(n);
                i + 1
            }
            None if matches!(n, Number::Zero | Number::Int | Number::Frac | Number::Exp) => {
                self.token = Token::None;
                self.value_done(part, i);
                i
            }
            None => {
                self.broken = true;
                part.len()
            }
        }
    }

    fn word(&mut self, part: &[u8], i: usize, word: &'static [u8], at: usize) -> usize {
        if part[i] != word[at] {
            self.broken = true;
            return part.len();
        }
        if at + 1 == word.len() {
            self.token = Token::None;
            self.value_done(part, i + 1);
        } else {
            self.token = Token::Word { word, at: at + 1 };
        }
        i + 1
    }

    /// A byte outside any token; `true` when it closed a container.
    fn structural(&mut self, part: &[u8], i: usize) -> bool {
        let b = part[i];
        if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            return false;
        }
        match (self.expect, b) {
            (Expect::ValueOrEnd, b']') | (Expect::KeyOrEnd, b'}') => return self.close(part, i),
            (Expect::Value | Expect::ValueOrEnd, _) => self.value_starts(part, i),
            (Expect::KeyOrEnd | Expect::Key, b'"') => {
                self.key.clear();
                self.key_push(&[b]);
                self.token = Token::Str { key: true };
            }
            (Expect::Colon, b':') => self.expect = Expect::Value,
            (Expect::CommaOrEnd, b',') => {
                self.expect = match self.stack.last() {
                    Some(true) => Expect::Key,
                    _ => Expect::Value,
                };
            }
            (Expect::CommaOrEnd, b'}') if self.stack.last() == Some(&true) => {
                return self.close(part, i);
            }
            (Expect::CommaOrEnd, b']') if self.stack.last() == Some(&false) => {
                return self.close(part, i);
            }
            _ => self.broken = true,
        }
        false
    }

    fn value_starts(&mut self, part: &[u8], i: usize) {
        let b = part[i];
        let depth = self.stack.len();
        if depth == 0 && !matches!(b, b'{' | b'[') {
            self.broken = true;
            return;
        }
        self.keep_from(depth, i, b == b'{');
        match b {
            b'{' => {
                self.is_object |= depth == 0;
                self.stack.push(true);
                self.expect = Expect::KeyOrEnd;
            }
            b'[' => {
                self.stack.push(false);
                self.expect = Expect::ValueOrEnd;
            }
            b'"' => self.token = Token::Str { key: false },
            b'-' => self.token = Token::Num(Number::Minus),
            b'0' => self.token = Token::Num(Number::Zero),
            b'1'..=b'9' => self.token = Token::Num(Number::Int),
            b't' => {
                self.token = Token::Word {
                    word: b"true",
                    at: 1,
                }
            }
            b'f' => {
                self.token = Token::Word {
                    word: b"false",
                    at: 1,
                }
            }
            b'n' => {
                self.token = Token::Word {
                    word: b"null",
                    at: 1,
                }
            }
            _ => self.broken = true,
        }
    }

    /// Starts keeping the value that starts at `part[i]`, when its key asked for it.
    fn keep_from(&mut self, depth: usize, i: usize, object: bool) {
        let interest = std::mem::replace(&mut self.interest, Interest::Skip);
        if interest == Interest::Skip {
            return;
        }
        if self.spelling_only {
            // Only where `params` is, to read its keys' spelling.
            if interest == Interest::Params && object {
                self.params = Some((Vec::new(), Vec::new()));
            }
            return;
        }
        self.member.clear();
        self.member.extend_from_slice(&self.key);
        self.member.push(b':');
        if interest == Interest::Params {
            self.hasher = Some((blake3::Hasher::new(), i));
            if object {
                self.params = Some((self.key.clone(), Vec::new()));
                return;
            }
        }
        self.keeping = Some(Keeping {
            depth,
            from: i,
            inner: depth == 2,
        });
    }

    fn close(&mut self, part: &[u8], i: usize) -> bool {
        self.stack.pop();
        if self.stack.is_empty() {
            self.expect = Expect::Done;
        } else {
            self.value_done(part, i + 1);
        }
        true
    }

    /// A value ended just before `part[end]`.
    fn value_done(&mut self, part: &[u8], end: usize) {
        self.expect = Expect::CommaOrEnd;
        let depth = self.stack.len();
        if let Some(k) = self.keeping.take_if(|k| k.depth == depth) {
            self.member.extend_from_slice(&part[k.from..end]);
            let member = std::mem::take(&mut self.member);
            match (&mut self.params, k.inner) {
                (Some((_, inner)), true) => push_member(inner, &member),
                _ => push_member(&mut self.top, &member),
            }
        }
        if depth != 1 {
            return;
        }
        if let Some((mut hasher, from)) = self.hasher.take() {
            hasher.update(&part[from..end]);
            self.params_hash = Some(hasher.finalize());
        }
        if let Some((key, inner)) = self.params.take() {
            let member = [&key[..], b":{", &inner, b"}"].concat();
            push_member(&mut self.top, &member);
        }
    }

    fn key_push(&mut self, bytes: &[u8]) {
        if self.decodes_keys() {
            self.key.extend_from_slice(bytes);
        }
    }

    /// Whether a peek decodes the keys of the object being read: the top level's, and an
    /// object `params`'s (to read the tool's name).
    fn decodes_keys(&self) -> bool {
        let depth = self.stack.len();
        depth == 1 || (depth == 2 && self.params.is_some())
    }

    /// The key has ended: what its member is to this scan.
    fn key_done(&mut self) {
        self.expect = Expect::Colon;
        self.interest = Interest::Skip;
        if !self.decodes_keys() {
            return;
        }
        let in_params = self.stack.len() == 2;
        let Ok(key) = serde_json::from_slice::<String>(&self.key) else {
            // A key a peek does not decode (a lone surrogate, not UTF-8): kept, member and
            // all, so that a peek at what is kept fails where a peek at the whole line does.
            self.interest = Interest::Keep;
            return;
        };
        let read = match in_params {
            true => jsonrpc::PARAMS_KEYS,
            false => jsonrpc::TOP_KEYS,
        };
        self.smuggles |= jsonrpc::spelled_like(&key, read);
        self.interest = match (in_params, key.as_str()) {
            (false, "id" | "method") => Interest::Keep,
            (false, "params") => Interest::Params,
            (true, "name" | "uri" | "cursor" | "_meta" | "requestId" | "progressToken") => {
                Interest::Keep
            }
            _ => Interest::Skip,
        };
    }
}

fn push_member(out: &mut Vec<u8>, member: &[u8]) {
    if !out.is_empty() {
        out.push(b',');
    }
    out.extend_from_slice(member);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc;

    /// Scans `line` fed in parts cut at `cuts`, returning how it ended and where the top-level
    /// value closed (an index into the line).
    fn scan_in_parts(line: &[u8], cuts: &[usize]) -> (Scanned, Option<usize>) {
        let mut scan = Scan::default();
        let (mut at, mut closed) = (0, None);
        for &cut in cuts.iter().chain([&line.len()]) {
            let cut = cut.clamp(at, line.len());
            if let Some(i) = scan.feed(&line[at..cut]) {
                closed = Some(at + i);
            }
            at = cut;
        }
        (scan.finish(), closed)
    }

    /// Every way of cutting `line` in two and in three (around every byte), and byte by byte.
    fn every_split(line: &[u8], check: impl Fn(Scanned, Option<usize>)) {
        for a in 0..=line.len() {
            check_split(line, &[a], &check);
            check_split(line, &[a, a + 1], &check);
        }
        let bytes: Vec<usize> = (1..line.len()).collect();
        check_split(line, &bytes, &check);
    }

    fn check_split(line: &[u8], cuts: &[usize], check: &impl Fn(Scanned, Option<usize>)) {
        let (scanned, closed) = scan_in_parts(line, cuts);
        check(scanned, closed);
    }

    fn gist(scanned: Scanned) -> Gist {
        match scanned {
            Scanned::Object(gist) => gist,
            other => panic!("not an object: {other:?}"),
        }
    }

    /// What the serving node reads of a request: id, method, the tool's name, the params'
    /// hash, the cancelled request.
    type Decision = (String, String, Option<String>, Option<String>, String);

    fn decision(line: &[u8]) -> Option<Decision> {
        let peek = jsonrpc::peek(line)?;
        Some((
            peek.id.map(|id| id.get().to_owned()).unwrap_or_default(),
            peek.method.as_deref().unwrap_or_default().to_owned(),
            peek.params.and_then(jsonrpc::subject_name),
            peek.params
                .map(|p| blake3::hash(p.get().as_bytes()).to_hex().to_string()),
            format!("{:?}", peek.cancelled_request().map(|r| r.get().to_owned())),
        ))
    }

    fn decision_of_gist(gist: &Gist) -> Option<Decision> {
        let (id, method, name, whole, cancelled) = decision(&gist.object)?;
        // As the ledger takes it: a `params` a peek reads as absent (`null`) has no hash.
        let hash = whole.and(gist.params_hash.map(|h| h.to_hex().to_string()));
        Some((id, method, name, hash, cancelled))
    }

    #[test]
    fn a_long_call_is_reduced_to_what_a_decision_reads_however_it_is_cut() {
        let lines: [&[u8]; 6] = [
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a\"b\\c\u00e9","n":[1,-2.5e3,0,true,false,null,{}]},"_meta":{"progressToken":"p"}}}"#,
            br#" { "params" : { "arguments" : [ 1 , { "x" : "}" } ] , "n\u0061me" : "echo" } , "method" : "tools/call" , "id" : "a-1" }  "#,
            br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r\"1","reason":"x"}}"#,
            br#"{"id":1,"method":"tools/list","params":{"cursor":"c2"}}"#,
            br#"{"id":2,"method":"ping","params":[1,2,{"name":"no"}]}"#,
            br#"{"id":3,"result":{"content":[{"type":"text","text":"big"}]}}"#,
        ];
        for line in lines {
            let whole = decision(line).expect("the fixture is a message");
            let last = line.iter().rposition(|b| *b == b'}').expect("an object");
            every_split(line, |scanned, closed| {
                assert_eq!(closed, Some(last), "{}", String::from_utf8_lossy(line));
                let gist = gist(scanned);
                assert_eq!(decision_of_gist(&gist).as_ref(), Some(&whole));
            });
        }
    }

    /// A small deterministic generator (xorshift), for the generated lines below.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        /// A JSON value whose members are drawn, now and then, from the keys decisions read.
        fn value(&mut self, depth: u32) -> serde_json::Value {
            use serde_json::json;
            const KEYS: [&str; 12] = [
                "id",
                "method",
                "params",
                "name",
                "_meta",
                "cursor",
                "requestId",
                "arguments",
                "x\"y",
                "Name",
                "requestid",
                "_\u{130}D",
            ];
            const STRINGS: [&str; 5] = ["", "tools/call", "é\u{1F600}\\\"", "line\nbreak", "}]{["];
            match self.below(if depth > 3 { 4 } else { 7 }) {
                0 => json!(null),
                1 => json!(self.below(2) == 1),
                2 => json!(self.below(1000) as f64 / 8.0 - 60.0),
                3 => json!(STRINGS[self.below(5) as usize]),
                4 | 5 => {
                    let mut map = serde_json::Map::new();
                    for _ in 0..self.below(5) {
                        let key = KEYS[self.below(KEYS.len() as u64) as usize];
                        map.insert(key.to_owned(), self.value(depth + 1));
                    }
                    serde_json::Value::Object(map)
                }
                _ => (0..self.below(4)).map(|_| self.value(depth + 1)).collect(),
            }
        }
    }

    #[test]
    fn generated_messages_are_read_as_a_peek_at_the_whole_line_reads_them() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut smuggled = 0;
        for _ in 0..3000 {
            let mut message = serde_json::json!({ "jsonrpc": "2.0" });
            for key in ["id", "method", "params"] {
                if rng.below(4) > 0 {
                    message[key] = rng.value(1);
                }
            }
            // Now and then a member spelled as one of those, as a parser ignoring case reads.
            for key in ["METHOD", "param\u{17F}"] {
                if rng.below(8) == 0 {
                    message[key] = rng.value(1);
                }
            }
            let line = if rng.below(2) == 0 {
                serde_json::to_vec(&message).unwrap()
            } else {
                serde_json::to_vec_pretty(&message).unwrap()
            };
            let cuts: Vec<usize> = (0..rng.below(6))
                .map(|_| rng.below(line.len() as u64) as usize)
                .collect();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let gist = gist(scan_in_parts(&line, &cuts).0);
            let text = String::from_utf8_lossy(&line);
            assert_eq!(decision_of_gist(&gist), decision(&line), "{text}");
            assert_eq!(gist.smuggles, smuggles(&line), "{text}");
            // Read off the message itself: a key spelled like one MCP reads, where it reads it.
            let spelled = |v: &serde_json::Value, keys: &[&str]| {
                v.as_object()
                    .is_some_and(|m| m.keys().any(|k| jsonrpc::spelled_like(k, keys)))
            };
            let expected = spelled(&message, jsonrpc::TOP_KEYS)
                || spelled(&message["params"], jsonrpc::PARAMS_KEYS);
            assert_eq!(gist.smuggles, expected, "{text}");
            smuggled += usize::from(gist.smuggles);
        }
        assert!(
            (300..2700).contains(&smuggled),
            "{smuggled} of 3,000 smuggle a member"
        );
    }

    #[test]
    fn members_a_decision_does_not_read_are_let_go_and_duplicates_are_kept() {
        let line = br#"{"id":1,"method":"tools/call","params":{"name":"ok","arguments":{"name":"inner"},"name":"bad"},"extra":[1,2,3]}"#;
        let gist = gist(scan_in_parts(line, &[30, 60]).0);
        assert_eq!(
            gist.object,
            br#"{"id":1,"method":"tools/call","params":{"name":"ok","name":"bad"}}"#
        );
        // Neither reading of a doubled name is taken: both peeks refuse it.
        assert_eq!(
            jsonrpc::peek(line).and_then(|p| p.params.and_then(jsonrpc::subject_name)),
            None
        );
        let peek = jsonrpc::peek(&gist.object).expect("a message");
        assert_eq!(peek.params.and_then(jsonrpc::subject_name), None);
    }

    #[test]
    fn what_a_strict_parser_refuses_is_refused() {
        let broken: [&[u8]; 16] = [
            br#"{"id":1,"method":"tools/call","params":{"name":"ok" /* ,"name":"bad" */}}"#,
            br#"{"id":1,"params":{"arguments":{'a':1}}}"#,
            br#"{"id":1,"params":{"arguments":[1,2,]}}"#,
            br#"{"id":1,"params":{"arguments":{"a" 1}}}"#,
            br#"{"id":1,"params":{"arguments":{"a":1 "b":2}}}"#,
            br#"{"id":1,"params":{"arguments":[1}}}"#,
            br#"{"id":1,"params":{"arguments":{"a":[}]}}"#,
            br#"{"id":1,"params":{"arguments":"\x"}}"#,
            br#"{"id":1,"params":{"arguments":"\u12g4"}}"#,
            b"{\"id\":1,\"params\":{\"arguments\":\"a\tb\"}}",
            br#"{"id":1,"params":{"arguments":012}}"#,
            br#"{"id":1,"params":{"arguments":NaN}}"#,
            br#"{"id":1,"params":{"arguments":-}}"#,
            br#"{"id":1,"params":{"arguments":1.}}"#,
            br#"{"id":1,"params":{"arguments":tru}}"#,
            br#"{"id":1} {"id":2}"#,
        ];
        for line in broken {
            assert!(
                serde_json::from_slice::<serde::de::IgnoredAny>(line).is_err(),
                "{}",
                String::from_utf8_lossy(line)
            );
            every_split(line, |scanned, _| {
                assert!(
                    matches!(scanned, Scanned::Broken),
                    "{} gave {scanned:?}",
                    String::from_utf8_lossy(line)
                );
            });
        }
    }

    #[test]
    fn a_line_cut_off_is_unclosed_and_a_batch_is_not_an_object() {
        let line =
            br#"{"id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"abc"#;
        let mut scan = Scan::default();
        assert_eq!(scan.feed(line), None);
        assert_eq!(scan.so_far(), br#"{"id":1,"method":"tools/call"}"#);
        assert!(matches!(scan.finish(), Scanned::Unclosed));
        let batch = br#"[{"id":1,"method":"ping"},{"id":2,"method":"ping"}]"#;
        every_split(batch, |scanned, closed| {
            assert!(matches!(scanned, Scanned::NotAnObject));
            assert_eq!(closed, Some(batch.len() - 1));
        });
        // Only a container is scanned: a long line that is one scalar is no message at all.
        assert!(matches!(
            scan_in_parts(br#""a string""#, &[3]).0,
            Scanned::Broken
        ));
    }

    #[test]
    fn a_look_ahead_reads_the_tool_named_before_the_arguments_end() {
        let mut scan = Scan::default();
        scan.feed(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"na"#);
        assert_eq!(
            scan.ahead(),
            br#"{"id":7,"method":"tools/call","params":{}}"#
        );
        scan.feed(br#"me":"echo","arguments":{"text":"abc"#);
        let ahead = scan.ahead();
        assert_eq!(
            ahead,
            br#"{"id":7,"method":"tools/call","params":{"name":"echo"}}"#
        );
        let peek = jsonrpc::peek(&ahead).unwrap();
        assert_eq!(
            peek.params.and_then(jsonrpc::subject_name).as_deref(),
            Some("echo")
        );
        let mut first = Scan::default();
        first.feed(br#"{"params":{"name":"echo","arguments":{"#);
        assert_eq!(first.ahead(), br#"{"params":{"name":"echo"}}"#);
        // Once `params` has ended, the look ahead is what the line kept.
        scan.feed(br#""}},"x":1"#);
        assert_eq!(scan.ahead(), scan.so_far());
    }

    #[test]
    fn a_key_a_peek_cannot_decode_fails_a_peek_at_what_was_kept_too() {
        let long = "k".repeat(200);
        let lines = [
            format!(r#"{{"id":1,"method":"m","\udfcb{long}":1}}"#),
            r#"{"id":1,"method":"m","\udfcb":1}"#.to_owned(),
            format!(
                r#"{{"id":1,"method":"tools/call","params":{{"name":"ok","\ud800{long}":{{}}}}}}"#
            ),
            // Deeper down, a peek does not decode keys.
            format!(
                r#"{{"id":1,"method":"tools/call","params":{{"name":"ok","arguments":{{"\ud800{long}":1}}}}}}"#
            ),
        ];
        for line in &lines {
            let line = line.as_bytes();
            every_split(line, |scanned, _| {
                let gist = gist(scanned);
                assert_eq!(
                    decision_of_gist(&gist),
                    decision(line),
                    "{}",
                    String::from_utf8_lossy(line)
                );
            });
        }
        assert_eq!(decision(lines[0].as_bytes()), None);
        assert_eq!(decision(lines[2].as_bytes()).and_then(|d| d.2), None);
        assert_eq!(
            decision(lines[3].as_bytes()).and_then(|d| d.2).as_deref(),
            Some("ok")
        );
    }

    #[test]
    fn nesting_of_any_depth_is_followed() {
        let deep = |open: &[u8], close: &[u8]| {
            let n = 100_000;
            [
                &b"{\"id\":1,\"method\":\"m\",\"params\":"[..],
                &open.repeat(n),
                b"0",
                &close.repeat(n),
                b"}",
            ]
            .concat()
        };
        let arrays = gist(scan_in_parts(&deep(b"[", b"]"), &[70_000]).0);
        assert_eq!(decision_of_gist(&arrays).unwrap().1, "m");
        let objects = gist(scan_in_parts(&deep(b"{\"a\":", b"}"), &[]).0);
        assert_eq!(decision_of_gist(&objects).unwrap().0, "1");
        let batch = [b"[".repeat(100_000), b"]".repeat(100_000)].concat();
        assert!(matches!(scan_in_parts(&batch, &[]).0, Scanned::NotAnObject));
    }
}
