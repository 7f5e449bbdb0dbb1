//! Session bindings in the database (docs/scale.md, "Sessions"): the later binding wins, a move
//! is on the change feed and a refreshed last use is not, reads see only bindings in use, and
//! the upkeep's prune drops idle bindings and then the oldest beyond the cap, on both engines.
//! The fleet's behaviour (two servers behind a round-robin proxy) is tests/peers/test_sessions.py.

use crate::support;
use rota::engine::ProfileId;
use rota::store::{DatabaseTarget, SessionBinding, Store};

fn binding(session: &str, profile: &str, bound_at: i64, seen_at: i64) -> SessionBinding {
    SessionBinding { session: session.into(), profile: profile.parse::<ProfileId>().unwrap(), bound_at, seen_at }
}

async fn bind(store: &dyn Store, b: SessionBinding) {
    store.apply(&[], &[], &[b], &Default::default()).await.unwrap();
}

async fn bindings_keep_the_later_binding_feed_moves_and_prune(target: DatabaseTarget) {
    let store = rota::store::open(&target).await.unwrap();
    let store = store.as_ref();
    let t = 1_800_000_000_000;
    let head = store.feed_head(None).await.unwrap();
    bind(store, binding("conv-1", "openai:a", t, t)).await;
    let fed = store.changes_after(head).await.unwrap();
    assert_eq!(fed.len(), 1, "{fed:?}");
    assert_eq!(
        (fed[0].kind.as_str(), SessionBinding::of_feed(&fed[0].key)),
        ("session", Some(binding("conv-1", "openai:a", t, t)))
    );

    // A move is fed; a binding older than the stored one changes nothing.
    let head = fed[0].seq;
    bind(store, binding("conv-1", "openai:b", t + 10, t + 10)).await;
    bind(store, binding("conv-1", "openai:c", t + 5, t + 20)).await;
    let fed = store.changes_after(head).await.unwrap();
    assert_eq!(
        fed.iter().map(|e| SessionBinding::of_feed(&e.key)).collect::<Vec<_>>(),
        [Some(binding("conv-1", "openai:b", t + 10, t + 10))]
    );
    assert_eq!(store.session_bindings("conv-1", t).await.unwrap(), [binding("conv-1", "openai:b", t + 10, t + 10)]);

    // Its last use refreshed: stored, not fed. Another provider's binding of the session is its own.
    let head = fed[0].seq;
    bind(store, binding("conv-1", "openai:b", t + 10, t + 600_000)).await;
    bind(store, binding("conv-1", "anthropic:a", t + 30, t + 30)).await;
    let fed = store.changes_after(head).await.unwrap();
    assert_eq!(
        fed.iter().map(|e| SessionBinding::of_feed(&e.key)).collect::<Vec<_>>(),
        [Some(binding("conv-1", "anthropic:a", t + 30, t + 30))]
    );
    let mut both = store.session_bindings("conv-1", t).await.unwrap();
    both.sort_by_key(|b| b.bound_at);
    assert_eq!(
        both,
        [binding("conv-1", "openai:b", t + 10, t + 600_000), binding("conv-1", "anthropic:a", t + 30, t + 30)]
    );
    assert_eq!(store.session_bindings("conv-1", t + 31).await.unwrap().len(), 1, "only bindings used since");

    // The prune: the idle ones, then the oldest beyond the cap, a batch at a time.
    for i in 0..5 {
        bind(store, binding(&format!("conv-{}", 10 + i), "openai:a", t + 100 + i, t + 700_000 + i)).await;
    }
    assert_eq!(store.prune_sessions(t + 31, 100, 1).await.unwrap(), 1, "one batch of one: anthropic:a's idle binding");
    assert_eq!(store.prune_sessions(t + 31, 100, 10).await.unwrap(), 0);
    assert_eq!(store.prune_sessions(t + 31, 3, 10).await.unwrap(), 3, "6 bindings, 3 kept: the newest");
    let mut left = Vec::new();
    for s in ["conv-1", "conv-10", "conv-11", "conv-12", "conv-13", "conv-14"] {
        left.extend(store.session_bindings(s, 0).await.unwrap().into_iter().map(|b| b.session));
    }
    assert_eq!(left, ["conv-12", "conv-13", "conv-14"]);
    store.close().await;
}

#[tokio::test]
async fn sqlite_bindings_keep_the_later_binding_feed_moves_and_prune() {
    let dir = tempfile::tempdir().unwrap();
    bindings_keep_the_later_binding_feed_moves_and_prune(DatabaseTarget::Sqlite(dir.path().join("rota.db"))).await;
}

#[tokio::test]
async fn postgres_bindings_keep_the_later_binding_feed_moves_and_prune() {
    let url = support::postgres_database().await;
    bindings_keep_the_later_binding_feed_moves_and_prune(DatabaseTarget::Postgres(url)).await;
}
