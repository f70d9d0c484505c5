//! A bounded parser for `text/event-stream` bodies (the SSE framing of Streamable HTTP), fed
//! in whatever chunks the network delivers.
//!
//! Only what MCP uses is kept: each event's `data` (lines joined by `\n`) and its `id`; `retry`
//! updates the reconnection delay; `event` names and comments are skipped. No line and no
//! event's data may exceed the cap given at construction: past it the parser reports
//! [`SseError::TooLarge`] instead of growing.
//!
//! Ours, not a crate's: nothing in the dependency tree reads SSE (axum only writes it), and the
//! cap must hold while an event is still arriving, not once it is whole.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub data: Vec<u8>,
    /// The stream's last event id after this event (for `Last-Event-ID`).
    pub id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event larger than the frame cap")]
    TooLarge,
}

#[derive(Debug)]
pub struct SseParser {
    cap: usize,
    line: Vec<u8>,
    /// The previous chunk ended in `\r`: a `\n` starting the next one belongs to it.
    after_cr: bool,
    data: Vec<u8>,
    has_data: bool,
    last_id: Option<String>,
    pub retry_ms: Option<u64>,
}

impl SseParser {
    pub fn new(cap: usize) -> Self {
        SseParser {
            cap,
            line: Vec::new(),
            after_cr: false,
            data: Vec::new(),
            has_data: false,
            last_id: None,
            retry_ms: None,
        }
    }

    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Feeds a chunk; returns the events it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, SseError> {
        let mut events = Vec::new();
        for &b in chunk {
            if std::mem::take(&mut self.after_cr) && b == b'\n' {
                continue;
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_done(&line)? {
                        events.push(event);
                    }
                }
                _ => {
                    if self.line.len() >= self.cap {
                        return Err(SseError::TooLarge);
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(events)
    }

    fn line_done(&mut self, line: &[u8]) -> Result<Option<Event>, SseError> {
        if line.is_empty() {
            // Dispatch.
            if !std::mem::take(&mut self.has_data) {
                return Ok(None);
            }
            let data = std::mem::take(&mut self.data);
            return Ok(Some(Event {
                data,
                id: self.last_id.clone(),
            }));
        }
        if line[0] == b':' {
            return Ok(None); // a comment (keep-alive)
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                if self.data.len() + value.len() > self.cap {
                    return Err(SseError::TooLarge);
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"id" if !value.contains(&0) => {
                self.last_id = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" => {
                if let Some(ms) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                    self.retry_ms = Some(ms);
                }
            }
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_and_every_line_ending_parse_alike() {
        let stream = b": ping\r\nid: 7\r\nevent: message\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nretry: 250\nid: 8\ndata:{}\n\n\rdata: x\r\r";
        for split in 0..stream.len() {
            let mut p = SseParser::new(1024);
            let mut events = p.feed(&stream[..split]).unwrap();
            events.extend(p.feed(&stream[split..]).unwrap());
            assert_eq!(
                events,
                vec![
                    Event {
                        data: b"{\"a\":\n1}".to_vec(),
                        id: Some("7".into())
                    },
                    Event {
                        data: b"{}".to_vec(),
                        id: Some("8".into())
                    },
                    Event {
                        data: b"x".to_vec(),
                        id: Some("8".into())
                    },
                ],
                "split at {split}"
            );
            assert_eq!(p.retry_ms, Some(250));
        }
    }

    #[test]
    fn a_priming_event_without_data_is_not_dispatched_and_size_is_capped() {
        let mut p = SseParser::new(8);
        assert_eq!(p.feed(b"id: 1\n\n").unwrap(), vec![]);
        assert_eq!(p.last_id(), Some("1"));
        assert_eq!(p.feed(b"data: 0123456789\n"), Err(SseError::TooLarge));
        let mut p = SseParser::new(8);
        assert_eq!(p.feed(b"data: 0123\ndata: 4567\n"), Err(SseError::TooLarge));
    }
}
