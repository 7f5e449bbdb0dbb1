//! Server-sent events, split without changing a byte: rota forwards the upstream's exact bytes
//! and only looks inside to find the first content event, errors, usage and keep-alives.

/// One complete event as received (its bytes include the blank line that ended it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub raw: Vec<u8>,
    pub name: Option<String>,
    pub data: String,
}

impl Event {
    /// A comment-only event (`: ping`) or an empty one: a keep-alive, not data.
    pub fn is_keepalive(&self) -> bool {
        self.name.is_none() && self.data.is_empty()
    }

    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.data).ok()
    }
}

#[derive(Default, Debug)]
pub struct Splitter {
    buf: Vec<u8>,
}

impl Splitter {
    /// Adds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = event_end(&self.buf) {
            let raw: Vec<u8> = self.buf.drain(..end).collect();
            out.push(parse(raw));
        }
        out
    }

    /// Bytes of an event not yet complete.
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }
}

/// The end (exclusive) of the first complete event: after `\n\n` or `\r\n\r\n`.
fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn parse(raw: Vec<u8>) -> Event {
    let text = String::from_utf8_lossy(&raw);
    let (mut name, mut data) = (None, Vec::new());
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim().to_string());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
        }
    }
    let data = data.join("\n");
    Event { raw, name, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_keep_their_exact_bytes() {
        let mut s = Splitter::default();
        assert!(s.push(b"event: message_start\ndata: {\"a\"").is_empty());
        let evs = s.push(b":1}\n\n: ping\n\ndata: [DONE]\r\n\r\ndata: par");
        assert_eq!(evs.len(), 3);
        assert_eq!(evs[0].raw, b"event: message_start\ndata: {\"a\":1}\n\n");
        assert_eq!((evs[0].name.as_deref(), evs[0].data.as_str()), (Some("message_start"), "{\"a\":1}"));
        assert!(evs[1].is_keepalive());
        assert_eq!(evs[2].data, "[DONE]");
        assert_eq!(s.rest(), b"data: par");
    }

    #[test]
    fn multi_line_data_is_joined() {
        let evs = Splitter::default().push(b"data: one\ndata: two\n\n");
        assert_eq!(evs[0].data, "one\ntwo");
    }
}
