//! Request bodies, bounded before they are parsed whole (docs/gateway.md, "Bounds at the door"):
//! the memory all bodies being read and parsed at once may take (`BUDGET`), and the number of
//! JSON values one body may hold (`VALUES_MAX`), since a parsed value takes several times the
//! bytes it was written in.

use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use tokio::sync::{Semaphore, SemaphorePermit};

/// The bytes of request bodies read and parsed at once, across requests: more wait for their
/// turn. A body of up to `SMALL` bytes never waits (requests are mostly small, and a slow
/// client holding a large share must not stall them).
pub const BUDGET: usize = 16 << 20;
const SMALL: usize = 64 << 10;

/// The most JSON values (objects, arrays, strings, numbers…) one body may hold: a parsed value
/// takes 32 bytes and more, so this bounds a body's parsed size to tens of MB whatever its
/// shape.
pub const VALUES_MAX: usize = 500_000;

/// The budget, in KiB.
pub struct Bodies(Semaphore);

impl Default for Bodies {
    fn default() -> Self {
        Bodies(Semaphore::new(BUDGET >> 10))
    }
}

impl Bodies {
    /// Waits until the body the request announces (`content-length`; `limit` when it announces
    /// none) fits in the budget, and holds its share while the permit lives.
    pub async fn admit(&self, headers: &HeaderMap, limit: usize) -> Option<SemaphorePermit<'_>> {
        let announced = announced(headers).unwrap_or(limit).min(limit);
        if announced <= SMALL {
            return None;
        }
        let kib = announced.div_ceil(1024).min(BUDGET >> 10) as u32;
        self.0.acquire_many(kib).await.ok()
    }
}

/// Why a body was not read whole.
pub enum Unread {
    /// It is longer than the limit.
    TooLarge,
    /// Reading it failed (the client went away, or was too slow: `BodyTimeout`).
    Failed(axum::Error),
}

/// Reads a body whole, at most `limit` bytes. A body in one chunk is taken as it is; a longer one
/// is copied chunk by chunk into one buffer sized from `content-length` (within the limit), each
/// chunk freed as it is copied, so a body is never held twice (as gathering the chunks, then
/// joining them, does).
pub async fn read(body: axum::body::Body, headers: &HeaderMap, limit: usize) -> Result<Bytes, Unread> {
    use futures_util::StreamExt;
    let mut chunks = body.into_data_stream();
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(Unread::Failed)?;
        len += chunk.len();
        if len > limit {
            return Err(Unread::TooLarge);
        }
        match (&mut joined, first.take()) {
            (Some(buf), _) => buf.extend_from_slice(&chunk),
            (None, None) => first = Some(chunk),
            (None, Some(head)) => {
                let mut buf = BytesMut::with_capacity(announced(headers).unwrap_or(0).clamp(len, limit));
                buf.extend_from_slice(&head);
                buf.extend_from_slice(&chunk);
                joined = Some(buf);
            }
        }
    }
    Ok(joined.map(BytesMut::freeze).or(first).unwrap_or_default())
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

    #[tokio::test]
    async fn small_bodies_never_wait_and_large_ones_share_the_budget() {
        let bodies = Bodies::default();
        let with = |n: usize| {
            let mut h = HeaderMap::new();
            h.insert(http::header::CONTENT_LENGTH, n.to_string().parse().unwrap());
            h
        };
        let big = bodies.admit(&with(BUDGET), usize::MAX).await;
        assert!(big.is_some());
        assert!(bodies.admit(&with(1000), usize::MAX).await.is_none(), "a small body does not wait");
        let large = with(SMALL + 1);
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), bodies.admit(&large, usize::MAX));
        assert!(waiting.await.is_err(), "a large one waits while the budget is taken");
        drop(big);
        assert!(bodies.admit(&with(SMALL + 1), usize::MAX).await.is_some());
        let unannounced = bodies.admit(&HeaderMap::new(), 32 << 20).await.unwrap();
        assert_eq!(
            unannounced.num_permits(),
            BUDGET >> 10,
            "no content-length: the limit is reserved, at most the budget"
        );
    }

    #[tokio::test]
    async fn a_body_is_read_whole_into_one_buffer_and_never_past_its_limit() {
        let chunked = |parts: &[&'static [u8]]| {
            let parts: Vec<Result<Bytes, std::io::Error>> = parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
            axum::body::Body::from_stream(futures_util::stream::iter(parts))
        };
        let mut announced = HeaderMap::new();
        announced.insert(http::header::CONTENT_LENGTH, "9".parse().unwrap());
        let read_ok = |r: Result<Bytes, Unread>| r.ok().expect("read whole");
        let whole = read_ok(read(chunked(&[b"abc", b"def", b"ghi"]), &announced, 100).await);
        assert_eq!(&whole[..], b"abcdefghi");
        let one: &'static [u8] = b"{}";
        let taken = read_ok(read(chunked(&[one]), &HeaderMap::new(), 100).await);
        assert_eq!(taken.as_ptr(), one.as_ptr(), "one chunk is taken as it is, not copied");
        assert!(read_ok(read(chunked(&[]), &HeaderMap::new(), 100).await).is_empty());
        // A content-length that lies (larger than the body, or than the limit) sizes nothing past the limit.
        let mut lying = HeaderMap::new();
        lying.insert(http::header::CONTENT_LENGTH, "1000000".parse().unwrap());
        assert_eq!(&read_ok(read(chunked(&[b"ab", b"cd"]), &lying, 10).await)[..], b"abcd");
        assert!(matches!(read(chunked(&[b"abcdef", b"ghijk"]), &announced, 10).await, Err(Unread::TooLarge)));
    }
}
