//! The stream relay: the upstream's bytes in, the client's bytes out, whatever the chunking.
//!
//! `Relay` is pure: it splits what the upstream wrote into events, holds them until the first
//! content event (docs/gateway.md), then lets every event through, in order, as received or translated
//! into the client's format. It forwards whole events only, so a stream cut in the middle of an
//! event never hands the client half an event. `forward` is its I/O: the task that feeds it the
//! rest of a committed stream and tells the walk how the stream ended.

use super::call::Opened;
use super::wire::{self, Api, Glance, Seen};
use crate::engine::classify::{Classified, Observed};
use crate::engine::{Millis, Reason};
use crate::gateway::translate::StreamTranslator;
use crate::gateway::translate::sse::Splitter;
use crate::prices::Tokens;
use crate::redact::redact;
use crate::settings::Settings;
use crate::store::AttemptRow;
use crate::walk::{Attempt, Ended, Runtime, STOPPING, Walk};
use axum::body::Body;
use axum::http::HeaderValue;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use std::sync::Arc;
use tokio::time::{Instant, timeout_at};
use tracing::Instrument;

/// Where a stream stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No content yet: events are held, nothing reaches the client, a failure fails over.
    Held,
    /// Committed: events flow to the client.
    Flowing,
    /// The terminal event arrived: the stream is whole (anything after it is ignored).
    Complete,
    /// The upstream sent an error event (its data). After commit, the event reached the client.
    Failed { data: String, committed: bool },
    /// The upstream ended its stream before any content.
    Empty,
}

pub struct Relay {
    upstream: Api,
    split: Splitter,
    translator: Option<StreamTranslator>,
    /// Client bytes not yet taken (all of them, while held).
    out: Vec<u8>,
    phase: Phase,
    received: bool,
    /// Token usage seen so far.
    pub tokens: Tokens,
    /// The signatures of the thinking blocks an Anthropic upstream sent (`thinking`).
    pub signatures: Vec<String>,
}

impl Relay {
    /// A relay for a stream of the `upstream` API; `translator` when the client speaks another.
    pub fn new(upstream: Api, translator: Option<StreamTranslator>) -> Relay {
        Relay {
            upstream,
            split: Splitter::default(),
            translator,
            out: Vec::new(),
            phase: Phase::Held,
            received: false,
            tokens: Tokens::default(),
            signatures: Vec::new(),
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Takes in what the upstream wrote; tells whether it carried data, for the idle timeout: an
    /// event other than a keep-alive comment, or the start of one still arriving.
    pub fn push(&mut self, bytes: &[u8]) -> bool {
        if !matches!(self.phase, Phase::Held | Phase::Flowing) {
            return false;
        }
        self.received |= !bytes.is_empty();
        let mut data = false;
        for ev in self.split.push(bytes) {
            data |= !ev.is_keepalive();
            let glance = if ev.is_keepalive() || ev.data.trim() == "[DONE]" { None } else { Glance::of(&ev.data) };
            if let Some(g) = &glance {
                self.tokens = self.tokens.and(g.tokens);
            }
            if self.upstream == Api::Messages
                && ev.data.contains("\"signature_delta\"")
                && let Some(v) = ev.json()
            {
                self.signatures.extend(super::thinking::signatures(&v).into_iter().map(str::to_string));
            }
            let seen = wire::classify_event(self.upstream, &ev, glance.as_ref());
            let committed = self.phase == Phase::Flowing;
            match seen {
                Seen::Content if !committed => self.phase = Phase::Flowing,
                Seen::End if !committed => self.phase = Phase::Empty,
                Seen::End => self.phase = Phase::Complete,
                Seen::Error => self.phase = Phase::Failed { data: ev.data.clone(), committed },
                Seen::Content | Seen::Other => {}
            }
            if matches!(self.phase, Phase::Empty | Phase::Failed { committed: false, .. }) {
                self.out.clear();
                break;
            }
            match self.translator.as_mut() {
                Some(t) => self.out.extend(t.push(&ev)),
                None => self.out.extend_from_slice(&ev.raw),
            }
            if self.phase != Phase::Flowing && self.phase != Phase::Held {
                break;
            }
        }
        data || self.split.rest().first().is_some_and(|&b| b != b':')
    }

    /// The client's bytes ready to send: nothing while the stream is held.
    pub fn take(&mut self) -> Vec<u8> {
        match self.phase {
            Phase::Held | Phase::Empty | Phase::Failed { committed: false, .. } => Vec::new(),
            _ => std::mem::take(&mut self.out),
        }
    }

    /// The upstream closed its stream: why it is not whole, if it is not. A reply with no
    /// event at all, or none but the terminal one, is empty (`server_error`); any other stream
    /// without its terminal event was cut (`network`).
    pub fn closed(&self) -> Result<(), (Reason, String)> {
        let end = self.upstream.terminal_event();
        let cut = |m: String| Err((Reason::Network, m));
        match self.phase {
            Phase::Complete => Ok(()),
            Phase::Held if !self.received => {
                Err((Reason::ServerError, "the stream ended before any content (empty reply)".into()))
            }
            Phase::Empty => {
                Err((Reason::ServerError, format!("the stream ended with `{end}` before any content (empty reply)")))
            }
            _ if !self.split.rest().is_empty() => {
                cut(format!("the upstream closed the stream in the middle of an event, before `{end}`"))
            }
            Phase::Held => cut(format!("the upstream closed the stream before any content and before `{end}`")),
            _ => cut(format!("the upstream closed the stream before its terminal event `{end}`")),
        }
    }
}

/// The attempt whose stream is committed, with all the relay hands the walk when it ends.
pub struct Committed {
    pub walk: Walk,
    pub att: Attempt,
    /// The attempt's row, its time to first byte set.
    pub row: AttemptRow,
    pub opened: Opened,
    /// When the request was sent.
    pub sent: Instant,
}

/// Answers the client with a committed stream: the held bytes now, the rest from a task that
/// forwards it and hands the walk the stream's ending. The task runs in a span of its own
/// (`relay`) within the current one: what it logs carries the request's id.
pub fn respond(
    runtime: &Runtime,
    settings: Arc<Settings>,
    client: Api,
    committed: Committed,
    deadline: Instant,
) -> Response {
    let Committed { mut walk, att, mut row, opened, sent } = committed;
    let Opened { mut relay, rest: mut upstream, client: asked, signed } = opened;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let book = runtime.book.clone();
    let clock = runtime.clock.clone();
    let stopping = runtime.stopping.clone();
    row.http_status = Some(200);
    // Exported as a trace, the attempt lasts until its stream ends, with what it came to.
    let attempt = crate::telemetry::on().then(tracing::Span::current);
    let relay_task = async move {
        let timeouts = &settings.config.timeouts;
        let secrets = att.cred.secrets();
        let failed = |reason: Reason, message: String| Ended::Failed {
            class: Classified {
                reason,
                hint: None,
                account_wide: false,
                message: redact(&message, &secrets),
                claim: false,
            },
            said: false,
        };
        let mut gone = tx.send(Ok(Bytes::from(relay.take()))).await.is_err();
        let mut idle_deadline = Instant::now() + timeouts.idle;
        let mut cut: Option<Ended> = None;
        while !gone && cut.is_none() && *relay.phase() == Phase::Flowing {
            let next = tokio::select! {
                _ = tx.closed() => { gone = true; break }
                _ = stopping.cancelled() => {
                    cut = Some(Ended::Stopped(STOPPING.into()));
                    break;
                }
                next = timeout_at(idle_deadline.min(deadline), upstream.next()) => next,
            };
            match next {
                Err(_) if Instant::now() >= deadline => {
                    let limit = timeouts.total.as_secs();
                    cut = Some(Ended::Deadline(format!("the request passed its {limit}s limit (timeouts.total)")));
                }
                Err(_) => {
                    cut = Some(failed(Reason::Timeout, format!("the stream was idle for {}s", timeouts.idle.as_secs())))
                }
                Ok(None) => cut = relay.closed().err().map(|(reason, why)| failed(reason, why)),
                Ok(Some(Err(e))) => cut = Some(failed(Reason::Network, crate::redact::error_text(&e))),
                Ok(Some(Ok(chunk))) => {
                    if relay.push(&chunk) {
                        idle_deadline = Instant::now() + timeouts.idle;
                    }
                    let out = relay.take();
                    gone = !out.is_empty() && tx.send(Ok(Bytes::from(out))).await.is_err();
                }
            }
        }
        let ended = match (gone, cut, relay.phase()) {
            (true, ..) => failed(Reason::Cancelled, "the client went away; the upstream stream was aborted".into()),
            (false, Some(ended), _) => ended,
            (false, None, Phase::Failed { data, .. }) => {
                let strings = asked.strings();
                let echoed = asked.echoed(&strings);
                let seen = Observed { status: Some(200), headers: &[], body: data, transport: None, echoed };
                let mut class = settings.classifier.classify(&seen, clock.now());
                class.message = redact(&class.message, &secrets);
                Ended::Failed { class, said: true }
            }
            (false, None, _) => Ended::Whole,
        };
        // rota says in-band why the stream broke, unless the upstream said it itself.
        let why = match &ended {
            Ended::Failed { class, said: false } if class.reason != Reason::Cancelled => Some(class.message.as_str()),
            Ended::Deadline(message) | Ended::Stopped(message) => Some(message.as_str()),
            _ => None,
        };
        if let Some(why) = why {
            let _ = tx.send(Ok(Bytes::from(client.error_event(&format!("upstream stream failed: {why}"))))).await;
        }
        drop(tx);
        row.duration_ms = Some(sent.elapsed().as_millis() as Millis);
        signed.record(&row.provider, relay.signatures.iter().map(String::as_str));
        let finish = || walk.stream_ended(&book, &att, row, ended, relay.tokens, clock.now());
        match attempt {
            Some(attempt) => attempt.in_scope(finish),
            None => finish(),
        }
    };
    tokio::spawn(relay_task.instrument(tracing::info_span!("relay")));
    let mut rx = rx;
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static("text/event-stream"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Recorded upstream streams (`tests/fixtures/streams/`) and the API that wrote them.
    const RECORDED: [(&str, &str, Api); 16] = [
        ("anthropic-text", include_str!("../../tests/fixtures/streams/anthropic-text.sse"), Api::Messages),
        ("anthropic-tool", include_str!("../../tests/fixtures/streams/anthropic-tool.sse"), Api::Messages),
        ("anthropic-thinking", include_str!("../../tests/fixtures/streams/anthropic-thinking.sse"), Api::Messages),
        (
            "anthropic-error-before-content",
            include_str!("../../tests/fixtures/streams/anthropic-error-before-content.sse"),
            Api::Messages,
        ),
        ("anthropic-truncated", include_str!("../../tests/fixtures/streams/anthropic-truncated.sse"), Api::Messages),
        ("openai-chat-text", include_str!("../../tests/fixtures/streams/openai-chat-text.sse"), Api::Chat),
        ("openai-chat-tool", include_str!("../../tests/fixtures/streams/openai-chat-tool.sse"), Api::Chat),
        ("openai-chat-preamble", include_str!("../../tests/fixtures/streams/openai-chat-preamble.sse"), Api::Chat),
        (
            "openai-chat-error-before-content",
            include_str!("../../tests/fixtures/streams/openai-chat-error-before-content.sse"),
            Api::Chat,
        ),
        ("openai-chat-truncated", include_str!("../../tests/fixtures/streams/openai-chat-truncated.sse"), Api::Chat),
        ("openai-chat-reasoning", include_str!("../../tests/fixtures/streams/openai-chat-reasoning.sse"), Api::Chat),
        (
            "openai-responses-tool",
            include_str!("../../tests/fixtures/streams/openai-responses-tool.sse"),
            Api::Responses,
        ),
        (
            "openai-responses-reasoning",
            include_str!("../../tests/fixtures/streams/openai-responses-reasoning.sse"),
            Api::Responses,
        ),
        (
            "openai-responses-text",
            include_str!("../../tests/fixtures/streams/openai-responses-text.sse"),
            Api::Responses,
        ),
        (
            "openai-responses-truncated",
            include_str!("../../tests/fixtures/streams/openai-responses-truncated.sse"),
            Api::Responses,
        ),
        (
            "openai-responses-error-before-content",
            include_str!("../../tests/fixtures/streams/openai-responses-error-before-content.sse"),
            Api::Responses,
        ),
    ];

    /// The client APIs a stream of `upstream` is relayed to: as it is, and translated.
    type Translator = fn() -> Option<StreamTranslator>;

    fn clients(upstream: Api) -> Vec<(Api, Translator)> {
        use StreamTranslator as T;
        match upstream {
            Api::Messages => vec![
                (Api::Messages, || None),
                (Api::Chat, || Some(T::anthropic_to_chat(true))),
                (Api::Responses, || T::then(Some(T::anthropic_to_chat(true)), Some(T::chat_to_responses()))),
            ],
            Api::Chat => vec![
                (Api::Chat, || None),
                (Api::Messages, || Some(T::chat_to_anthropic())),
                (Api::Responses, || Some(T::chat_to_responses())),
            ],
            Api::Responses => vec![
                (Api::Responses, || None),
                (Api::Chat, || Some(T::responses_to_chat(true))),
                (Api::Messages, || T::then(Some(T::responses_to_chat(true)), Some(T::chat_to_anthropic()))),
            ],
        }
    }

    /// What the client got from a stream written in `pieces`, and how the stream ended.
    fn relay(upstream: Api, translator: Option<StreamTranslator>, pieces: &[&[u8]]) -> (String, String) {
        let mut r = Relay::new(upstream, translator);
        let mut out = Vec::new();
        for p in pieces {
            r.push(p);
            out.extend(r.take());
            if !matches!(r.phase(), Phase::Held | Phase::Flowing) {
                break;
            }
        }
        let ending = match (r.phase(), r.closed()) {
            (Phase::Failed { data, committed }, _) => format!("failed (committed: {committed}): {data}"),
            (_, Ok(())) => "whole".to_string(),
            (_, Err((reason, why))) => format!("{reason}: {why}"),
        };
        // A translated chunk's `created` is the clock's: the same within a stream, not across runs.
        (without_created(&String::from_utf8(out).expect("UTF-8 out")), ending)
    }

    fn without_created(s: &str) -> String {
        ["\"created\":", "\"created_at\":"].iter().fold(s.to_string(), |s, key| {
            let mut out = String::with_capacity(s.len());
            let mut rest = s.as_str();
            while let Some(i) = rest.find(key) {
                let (head, tail) = rest.split_at(i + key.len());
                out.push_str(head);
                rest = tail.trim_start_matches(|c: char| c.is_ascii_digit());
            }
            out.push_str(rest);
            out
        })
    }

    fn whole(upstream: Api, translator: Option<StreamTranslator>, bytes: &[u8]) -> (String, String) {
        relay(upstream, translator, &[bytes])
    }

    #[test]
    fn unsplit_streams_reach_the_client_as_the_rules_say() {
        for (name, text, upstream) in RECORDED {
            let (out, ending) = whole(upstream, None, text.as_bytes());
            let text = without_created(text);
            match name {
                n if n.ends_with("error-before-content") => {
                    assert_eq!(out, "", "{name}: nothing of a failed-over stream reaches the client");
                    assert!(ending.starts_with("failed (committed: false)"), "{name}: {ending}");
                }
                n if n.ends_with("truncated") => {
                    assert_eq!(out, text, "{name}: every whole event passes through");
                    assert!(
                        ending.starts_with("network: the upstream closed the stream before its terminal"),
                        "{name}: {ending}"
                    );
                }
                _ => assert_eq!(
                    (out.as_str(), ending.as_str()),
                    (text.as_str(), "whole"),
                    "{name}: passed through unchanged"
                ),
            }
        }
    }

    #[test]
    fn translated_streams_end_only_when_their_source_did() {
        for (name, text, upstream) in RECORDED {
            for (client, translator) in clients(upstream).into_iter().skip(1) {
                let (out, ending) = whole(upstream, translator(), text.as_bytes());
                let terminal = client.terminal_event();
                if name.ends_with("truncated") {
                    assert!(!out.is_empty() && !out.contains(terminal), "{name} → {client:?}: no clean end: {out}");
                    assert!(ending.starts_with("network:"), "{name}: {ending}");
                } else if name.ends_with("error-before-content") {
                    assert_eq!(out, "", "{name}");
                } else {
                    let last = out.trim_end().rsplit("\n\n").next().unwrap_or("");
                    assert!(last.contains(terminal), "{name} → {client:?}: {out}");
                    assert_eq!(ending, "whole");
                }
            }
        }
    }

    #[test]
    fn an_event_still_arriving_is_data_for_the_idle_timeout_and_a_keepalive_is_not() {
        let mut r = Relay::new(Api::Chat, None);
        assert!(!r.push(b": keep-alive\n\n"));
        assert!(!r.push(b": keep-al"));
        let mut r = Relay::new(Api::Chat, None);
        assert!(r.push(b"data: {\"choices\":[{\"del"));
        assert!(r.push(b"ta\":{}}]}\n\n"));
    }

    #[test]
    fn a_stream_cut_in_the_middle_of_an_event_forwards_only_whole_events() {
        for (name, text, upstream) in RECORDED.iter().filter(|r| r.0.ends_with("-text")) {
            let last = text.trim_end().rfind("\n\n").expect("several events") + 2;
            let cut = &text[..last + 10];
            let (out, ending) = whole(*upstream, None, cut.as_bytes());
            assert_eq!(out, without_created(&text[..last]), "{name}");
            assert!(ending.contains("in the middle of an event"), "{name}: {ending}");
        }
    }

    #[test]
    fn every_single_split_gives_the_events_of_the_unsplit_stream() {
        for (name, text, upstream) in RECORDED {
            let b = text.as_bytes();
            for (client, translator) in clients(upstream) {
                let want = whole(upstream, translator(), b);
                for i in 0..=b.len() {
                    let got = relay(upstream, translator(), &[&b[..i], &b[i..]]);
                    assert_eq!(got, want, "{name} → {client:?}, split at byte {i}");
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_chunking_gives_the_events_of_the_unsplit_stream(
            which in 0..RECORDED.len(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
            cut_short in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let (name, text, upstream) = RECORDED[which];
            // Also a copy cut anywhere: a stream closed at an arbitrary byte.
            let b = &text.as_bytes()[..cut_short.map_or(text.len(), |i| i.index(text.len() + 1))];
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(b.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces: Vec<&[u8]> = Vec::new();
            let mut from = 0;
            for &to in &at {
                pieces.push(&b[from..to]);
                from = to;
            }
            pieces.push(&b[from..]);
            for (client, translator) in clients(upstream) {
                let want = whole(upstream, translator(), b);
                prop_assert_eq!(relay(upstream, translator(), &pieces), want, "{} → {:?}, writes {:?}", name, client, at);
            }
        }

        #[test]
        fn a_stream_cut_before_its_end_never_ends_cleanly_in_any_format(
            which in 0..RECORDED.len(),
            cut in any::<prop::sample::Index>(),
            writes in 1..8usize,
        ) {
            let (name, text, upstream) = RECORDED[which];
            let end = text.rfind(upstream.terminal_event()).unwrap_or(text.len());
            let b = &text.as_bytes()[..cut.index(end)];
            let pieces: Vec<&[u8]> = b.chunks(b.len().div_ceil(writes).max(1)).collect();
            for (client, translator) in clients(upstream) {
                let (out, ending) = relay(upstream, translator(), &pieces);
                prop_assert!(ending != "whole", "{} → {:?} cut at {}: {}", name, client, b.len(), ending);
                prop_assert!(!out.contains(client.terminal_event()), "{} → {:?} cut at {}: {}", name, client, b.len(), out);
            }
        }
    }
}
