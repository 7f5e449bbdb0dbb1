//! Config reload reads a settled file (docs/config.md, "Reload"): a file written in place is
//! applied only once its writer is done, never the part written so far, however sound that part
//! is on its own.

use crate::support::{self, KEYS, Mock, Rota, Scenario, chat, spawn};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_caught_half_written_under_load_answers_no_request() {
    let (_mock, base) = Mock::started().await;
    let cfg = format!("{}[aliases]\nfast = \"openai/gpt-4.1\"\n", support::config(&base));
    let rota = spawn(Scenario { config: &cfg, keys: &KEYS[..2], ..Scenario::default() }).await;
    let file = rota.dir.path().join("rota.toml");
    let whole = std::fs::read_to_string(&file).unwrap();
    // The part a writer that truncates and fills the file has written first: `[database]`, a
    // sound config on its own, with no provider and no model.
    let cut = whole.find("[providers.openai]").unwrap();
    let head = &whole[..cut];
    assert!(head.starts_with("[database]") && !head.contains("[providers"));
    let changed = whole.replace("fast = \"openai/gpt-4.1\"", "fast = \"openai/gpt-4.1-mini\"");
    let changed_rest = &changed[cut..];

    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..8)
        .map(|_| {
            let (url, key, stop) = (rota.url.clone(), rota.agent_key.clone(), stop.clone());
            tokio::spawn(async move {
                let client = Rota::client();
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) && statuses.len() < 20_000 {
                    let r = client
                        .post(format!("{url}/v1/chat/completions"))
                        .bearer_auth(&key)
                        .json(&chat())
                        .send()
                        .await
                        .unwrap();
                    statuses.push(r.status().as_u16());
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Written in place, in two writes 600 ms apart (less than the settling time).
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&file).unwrap();
        f.write_all(head.as_bytes()).unwrap();
        f.sync_all().unwrap();
        tokio::time::sleep(Duration::from_millis(600)).await;
        f.write_all(changed_rest.as_bytes()).unwrap();
    }
    // The whole file applies once it has settled.
    let started = std::time::Instant::now();
    loop {
        let mut body = chat();
        body["model"] = "fast".into();
        let r = rota.chat(body, &[]).await;
        assert_eq!(r.status(), 200);
        let model = r.json::<serde_json::Value>().await.unwrap()["model"].as_str().unwrap().to_string();
        if model == "gpt-4.1-mini" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "the whole file never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = started.elapsed();
    assert!(took >= rota::server::reload::SETTLE - Duration::from_millis(100), "applied before it settled: {took:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for task in load {
        let statuses = task.await.unwrap();
        answered += statuses.len();
        let refused: Vec<_> = statuses.iter().filter(|s| **s != 200).collect();
        assert!(
            refused.is_empty(),
            "{} of {} requests answered from the half-written file",
            refused.len(),
            statuses.len()
        );
    }
    assert!(answered > 100, "the load ran: {answered} requests");
    eprintln!("{answered} requests answered while the file was half written and after; none from the half");
}

/// Finding: a reload that removed every provider was applied like any other valid file. Now it
/// is refused (the last good config stays) unless the file says `server.allow_empty_reload`.
#[tokio::test]
async fn a_reload_that_leaves_no_provider_is_refused_unless_the_file_means_it() {
    let (_mock, base) = Mock::started().await;
    let cfg = support::config(&base);
    let rota = spawn(Scenario { config: &cfg, keys: &KEYS[..1], ..Scenario::default() }).await;
    let file = rota.dir.path().join("rota.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let database = text.lines().take(2).collect::<Vec<_>>().join("\n");
    std::fs::write(&file, format!("{database}\n")).unwrap();
    tokio::time::sleep(rota::server::reload::SETTLE + Duration::from_millis(1_000)).await;
    assert_eq!(rota.chat(support::chat(), &[]).await.status(), 200, "the last good config stays");
    std::fs::write(&file, format!("{database}\n[server]\nallow_empty_reload = true\n")).unwrap();
    let started = std::time::Instant::now();
    while rota.chat(support::chat(), &[]).await.status() == 200 {
        assert!(started.elapsed() < Duration::from_secs(5), "the meant change never applied");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
