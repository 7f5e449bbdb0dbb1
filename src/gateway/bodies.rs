//! Request bodies, bounded before they are parsed whole (docs/gateway.md, "Bounds at the door"):
//! the memory large bodies take from their first byte until their request ends
//! (`limits.bodies_in_flight_mb`), taken as they grow so that a slow client holds only what it
//! sent, and the number of JSON values one body may hold (`VALUES_MAX`), since a parsed value
//! takes several times the bytes it was written in.

use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A body of up to this many bytes takes nothing of the budget (requests are mostly small, and
/// they must never wait behind large ones).
const SMALL: usize = 64 << 10;
/// A larger body's buffer starts at this size (or its announced length), then doubles: few
/// copies as it grows, and a client that sends little holds little.
const START: usize = 256 << 10;

/// The most JSON values (objects, arrays, strings, numbers…) one body may hold: a parsed value
/// takes 32 bytes and more, so this bounds a body's parsed size to tens of MB whatever its
/// shape.
pub const VALUES_MAX: usize = 500_000;

/// The budget of large bodies in flight, in KiB, and the one body at a time that may go past
/// it, so that bodies waiting for each other's share never wait forever.
pub struct Bodies {
    budget: Arc<Semaphore>,
    overdraft: Arc<Semaphore>,
}

impl Bodies {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Bodies {
        let kib = (bytes >> 10).clamp(1, Semaphore::MAX_PERMITS);
        Bodies { budget: Arc::new(Semaphore::new(kib)), overdraft: Arc::new(Semaphore::new(1)) }
    }

    /// Reads a body whole, at most `limit` bytes, by `deadline` (`server.body_timeout`, the
    /// wait for the budget included). The buffer grows as the body arrives, doubling from 256 KiB
    /// up to the announced length (`content-length`, within the limit), each chunk freed as it
    /// is copied; past `SMALL`, each growth first takes its bytes from the budget. When the
    /// budget is taken, the body that gets the overdraft first reads on past it: so a client
    /// that announces much and sends little holds only what it sent, and bodies that each hold
    /// a part of the budget cannot wait for one another forever. The share is held until the
    /// request ends (`Share`).
    pub async fn read(
        &self,
        body: axum::body::Body,
        headers: &HeaderMap,
        limit: usize,
        deadline: tokio::time::Instant,
    ) -> Result<(Bytes, Share), Unread> {
        use futures_util::StreamExt;
        let mut chunks = body.into_data_stream();
        let mut share = Share::default();
        let mut first: Option<Bytes> = None;
        let mut joined: Option<BytesMut> = None;
        let mut len = 0usize;
        // The buffer grows to the announced length at most (a body without one, to the limit).
        let most = announced(headers).filter(|&n| n > 0).unwrap_or(limit).min(limit);
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(Unread::Failed)?;
            len += chunk.len();
            if len > limit {
                return Err(Unread::TooLarge);
            }
            let buf = match (&mut joined, first.take()) {
                (Some(buf), _) => buf,
                (None, None) if len <= SMALL => {
                    first = Some(chunk);
                    continue;
                }
                (None, head) => joined.insert(BytesMut::from(head.as_deref().unwrap_or_default())),
            };
            if len > buf.capacity() {
                let grown = (buf.capacity() * 2).max(START).min(most).max(len);
                self.take(&mut share, grown, deadline).await?;
                buf.reserve(grown - buf.len());
            }
            buf.extend_from_slice(&chunk);
        }
        Ok((joined.map(BytesMut::freeze).or(first).unwrap_or_default(), share))
    }

    /// Takes from the budget what a buffer of `capacity` bytes needs beyond what `share` holds
    /// (nothing under `SMALL`, nothing once it holds the overdraft).
    async fn take(&self, share: &mut Share, capacity: usize, deadline: tokio::time::Instant) -> Result<(), Unread> {
        let need = (capacity.saturating_sub(SMALL).div_ceil(1024) as u32).saturating_sub(share.kib());
        if need == 0 || share.overdraft.is_some() {
            return Ok(());
        }
        let permit = match self.budget.clone().try_acquire_many_owned(need) {
            Ok(p) => Some(p),
            Err(_) => {
                let wait = async {
                    tokio::select! {
                        biased;
                        p = self.budget.clone().acquire_many_owned(need) => Ok(p.ok()),
                        o = self.overdraft.clone().acquire_owned() => Err(o.ok()),
                    }
                };
                match tokio::time::timeout_at(deadline, wait).await {
                    Ok(Ok(p)) => p,
                    Ok(Err(o)) => {
                        share.overdraft = o;
                        None
                    }
                    Err(_) => return Err(Unread::Waited),
                }
            }
        };
        if let Some(p) = permit {
            match &mut share.budget {
                Some(held) => held.merge(p),
                None => share.budget = Some(p),
            }
        }
        Ok(())
    }
}

/// What a body holds of the budget, given back when the request ends (the parsed body lives
/// as long as the request, a committed stream's relay included).
#[derive(Debug, Default)]
pub struct Share {
    budget: Option<OwnedSemaphorePermit>,
    overdraft: Option<OwnedSemaphorePermit>,
}

impl Share {
    fn kib(&self) -> u32 {
        self.budget.as_ref().map_or(0, |p| p.num_permits() as u32)
    }
}

/// Why a body was not read whole.
pub enum Unread {
    /// It is longer than the limit.
    TooLarge,
    /// Reading it failed (the client went away, or was too slow: `BodyTimeout`).
    Failed(axum::Error),
    /// Its share of the budget did not come free by its deadline.
    Waited,
}

/// The body's length as its `content-length` announces it.
fn announced(headers: &HeaderMap) -> Option<usize> {
    headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
}

/// Whether `json` holds at most `max` values, counted without parsing it: one per opening
/// bracket and per separator outside strings (an upper bound of the values, near enough).
pub fn values_within(json: &[u8], max: usize) -> Result<(), String> {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' | b',' | b':' => values += 1,
            _ => {}
        }
        if values > max {
            return Err(format!("the request body holds more than {max} JSON values"));
        }
    }
    Ok(())
}

/// A large body's `model` when it is longer than a model name may be, read without parsing the
/// rest of the body into values (its other fields are skipped). Small bodies are not looked at
/// twice.
pub fn long_model(json: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow, default)]
        model: Option<std::borrow::Cow<'a, str>>,
    }
    if json.len() <= SMALL {
        return None;
    }
    let model = serde_json::from_slice::<Head<'_>>(json).ok()?.model?;
    let bound = crate::engine::chain::MODEL_NAME_MAX;
    (model.len() > bound).then(|| crate::engine::chain::bounded(&model).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_outside_strings_only() {
        assert!(values_within(br#"{"a":[1,2,3]}"#, 7).is_ok());
        assert!(values_within(br#"{"a":[1,2,3]}"#, 5).is_err());
        assert!(values_within(br#"{"a":"[,,,,{:\"]"}"#, 3).is_ok(), "brackets and quotes inside a string");
        let many = format!("[{}]", vec!["0"; 100].join(","));
        assert_eq!(values_within(many.as_bytes(), 50), Err("the request body holds more than 50 JSON values".into()));
    }

    #[test]
    fn a_large_bodys_long_model_is_found_without_parsing_the_rest() {
        let big = |model: &str| {
            serde_json::to_vec(&serde_json::json!({"messages": [{"content": "x".repeat(SMALL)}], "model": model}))
                .unwrap()
        };
        let long = "m".repeat(300);
        assert_eq!(long_model(&big(&long)).map(|m| m.len()), Some(256), "its bounded prefix");
        assert_eq!(long_model(&big("openai/gpt-4.1")), None);
        assert_eq!(long_model(format!(r#"{{"model":"{long}"}}"#).as_bytes()), None, "a small body is parsed once");
    }

    fn announcing(n: usize) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::CONTENT_LENGTH, n.to_string().parse().unwrap());
        h
    }

    /// A body sent in `chunk`-byte parts, `n` bytes in all.
    fn sent(n: usize, chunk: usize) -> axum::body::Body {
        let parts: Vec<Result<Bytes, std::io::Error>> =
            (0..n).step_by(chunk).map(|at| Ok(Bytes::from(vec![b' '; chunk.min(n - at)]))).collect();
        axum::body::Body::from_stream(futures_util::stream::iter(parts))
    }

    fn soon(ms: u64) -> tokio::time::Instant {
        tokio::time::Instant::now() + std::time::Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn a_slow_body_holds_what_it_sent_and_one_body_at_a_time_reads_past_the_budget() {
        let bodies = Arc::new(Bodies::new(1536 << 10));
        // Announces 32 MiB, sends 100 KiB, then nothing.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
        tx.send(Ok(Bytes::from(vec![b' '; 100 << 10]))).await.unwrap();
        let slow = axum::body::Body::from_stream(tokio_stream_of(rx));
        let of_slow = bodies.clone();
        let trickling =
            tokio::spawn(async move { drop(of_slow.read(slow, &announcing(32 << 20), 32 << 20, soon(60_000)).await) });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let taken = |b: &Bodies| (1536 - b.budget.available_permits()) as u32;
        assert!(taken(&bodies) <= 192, "the slow one holds its first 256 KiB less 64: {} KiB", taken(&bodies));

        let n = 900 << 10;
        let (one, a) = bodies.read(sent(n, 16 << 10), &announcing(n), 32 << 20, soon(1_000)).await.ok().unwrap();
        assert_eq!(one.len(), n);
        assert_eq!(a.kib(), ((n - SMALL) >> 10) as u32, "its buffer grown to its length, less 64 KiB");
        let (_, b) = bodies.read(sent(n, 16 << 10), &announcing(n), 32 << 20, soon(1_000)).await.ok().unwrap();
        assert!(b.overdraft.is_some(), "the budget was taken: this one read past it");
        let third = bodies.read(sent(n, 16 << 10), &announcing(n), 32 << 20, soon(200)).await;
        assert!(matches!(third, Err(Unread::Waited)), "no budget and the overdraft in use: it waits, to its deadline");
        drop(a);
        let (third, _) = bodies.read(sent(n, 16 << 10), &announcing(n), 32 << 20, soon(1_000)).await.ok().unwrap();
        assert_eq!(third.len(), n, "a finished request's share read the next one");
        drop(tx);
        trickling.abort();
    }

    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_into_one_buffer_and_never_past_its_limit() {
        let bodies = &Bodies::new(16 << 20);
        let chunked = |parts: &[&'static [u8]]| {
            let parts: Vec<Result<Bytes, std::io::Error>> = parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
            axum::body::Body::from_stream(futures_util::stream::iter(parts))
        };
        let read = |body, headers: HeaderMap, limit| async move {
            bodies.read(body, &headers, limit, soon(1_000)).await.map(|(b, _)| b)
        };
        let read_ok = |r: Result<Bytes, Unread>| r.ok().expect("read whole");
        let whole = read_ok(read(chunked(&[b"abc", b"def", b"ghi"]), announcing(9), 100).await);
        assert_eq!(&whole[..], b"abcdefghi");
        let one: &'static [u8] = b"{}";
        let taken = read_ok(read(chunked(&[one]), HeaderMap::new(), 100).await);
        assert_eq!(taken.as_ptr(), one.as_ptr(), "one chunk is taken as it is, not copied");
        assert!(read_ok(read(chunked(&[]), HeaderMap::new(), 100).await).is_empty());
        // A content-length that lies (larger than the body, or than the limit) sizes nothing past the limit.
        assert_eq!(&read_ok(read(chunked(&[b"ab", b"cd"]), announcing(1_000_000), 10).await)[..], b"abcd");
        assert!(matches!(read(chunked(&[b"abcdef", b"ghijk"]), announcing(9), 10).await, Err(Unread::TooLarge)));
        // A large body without a content-length grows by doubling, not a chunk at a time.
        let n = 3 << 20;
        let (big, share) = bodies.read(sent(n, 8 << 10), &HeaderMap::new(), 32 << 20, soon(5_000)).await.ok().unwrap();
        assert_eq!(big.len(), n);
        assert!(share.kib() <= 4 << 10, "its capacity, at most twice its length: {} KiB", share.kib());
    }
}
