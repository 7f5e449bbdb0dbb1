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
    /// How far `buf` is known to hold no event end, so a long event that arrives a few bytes at
    /// a time is not searched again from its start on every push.
    scanned: usize,
}

impl Splitter {
    /// Adds bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        // An end is found from its first `\n` on, which is at most 3 bytes long: it may have
        // begun in the last 2 bytes searched.
        let mut from = self.scanned.saturating_sub(2);
        while let Some(end) = event_end(&self.buf[from..]).map(|e| e + from) {
            let raw: Vec<u8> = self.buf.drain(..end).collect();
            out.push(parse(raw));
            from = 0;
        }
        self.scanned = self.buf.len();
        out
    }

    /// Bytes of an event not yet complete.
    pub fn rest(&self) -> &[u8] {
        &self.buf
    }
}

/// The end (exclusive) of the first complete event: after a blank line, whatever mix of `\n`
/// and `\r\n` ends its lines (`\n\n`, `\r\n\r\n`, `\r\n\n`, `\n\r\n`).
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(p) = buf[i..].iter().position(|&b| b == b'\n') {
        let n = i + p;
        match buf.get(n + 1) {
            Some(b'\n') => return Some(n + 2),
            Some(b'\r') if buf.get(n + 2) == Some(&b'\n') => return Some(n + 3),
            _ => i = n + 1,
        }
    }
    None
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
    fn mixed_line_ends_end_events() {
        let evs = Splitter::default().push(b"data: a\r\n\ndata: b\n\r\ndata: c\r\n\r\n");
        let data: Vec<&str> = evs.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["a", "b", "c"]);
    }

    #[test]
    fn an_event_dribbled_byte_by_byte_ends_where_it_ends() {
        let mut s = Splitter::default();
        let text = b"event: x\r\ndata: 1\r\n\r\ndata: 2\n\n";
        let mut evs = Vec::new();
        for b in text {
            evs.extend(s.push(std::slice::from_ref(b)));
        }
        assert_eq!(evs.iter().map(|e| e.raw.len()).sum::<usize>(), text.len());
        assert_eq!((evs[0].name.as_deref(), evs[1].data.as_str()), (Some("x"), "2"));
    }

    #[test]
    fn multi_line_data_is_joined() {
        let evs = Splitter::default().push(b"data: one\ndata: two\n\n");
        assert_eq!(evs[0].data, "one\ntwo");
    }
}
