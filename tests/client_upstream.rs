//! The client library's ups (issue 13): `Device::with_uplink` sends each up, resends a nacked
//! one with the same id (so the backend sees the same `Idempotency-Key`) no sooner than the
//! nack's `retry_after_ms`, and reports `Acked` once the backend took it; a 4xx is `Refused`
//! after one try.

mod common;

use std::time::{Duration, Instant};

use common::upstream::{Behave, Upstream};
use common::{wait_until, Cluster, SLACK};
use gateway::client::device::{Device, DeviceConfig, MemoryStore};
use gateway::client::uplink::{UpConfig, UpResult, Uplink};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The gateway's nacks say "retry after" its backoff cap: 300 ms here.
const RETRY_AFTER_MS: u64 = 300;

#[test]
fn nacked_ups_are_resent_with_their_key_after_retry_after() {
    let backend = Upstream::start(Behave::Status(503));
    let cap = RETRY_AFTER_MS.to_string();
    let url = backend.url();
    let args = ["--upstream-url", &url, "--upstream-max-tries", "1", "--upstream-backoff-cap-ms", &cap];
    let (c, _) = Cluster::form(1, &args);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (uplink, rx) = Uplink::channel(16);
    let ups = UpConfig { max_tries: 20, deadline: Duration::from_secs(30), ..Default::default() };
    let device =
        Device::new(DeviceConfig::new(&c.public_url(0), "dev1", &c.token("dev1", 0), 0), Box::new(MemoryStore::new(0)))
            .with_uplink(rx, ups);
    let stop = CancellationToken::new();
    let running = rt.spawn(device.run(|_| {}, stop.clone()));

    let sends: Vec<_> = (1..=5u64)
        .map(|id| {
            let u = uplink.clone();
            rt.spawn(async move { u.send(id, json!({"n": id})).await })
        })
        .collect();
    // Every up reached the failing backend at least once; then it recovers.
    wait_until(Duration::from_secs(10) + SLACK, "five first tries at the backend", || {
        if backend.count() >= 5 {
            Ok(())
        } else {
            Err(backend.count())
        }
    });
    backend.set(Behave::Ok);
    let results: Vec<UpResult> = sends
        .into_iter()
        .map(|h| {
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), h).await }).expect("answered").unwrap()
        })
        .collect();
    for (k, r) in results.iter().enumerate() {
        assert!(matches!(r, UpResult::Acked { tries } if *tries >= 2), "up {}: {r:?}", k + 1);
    }
    let seen = backend.seen();
    for id in 1..=5u64 {
        let key = format!("dev1:{id}");
        let tries: Vec<Instant> = seen.iter().filter(|s| s.key.as_deref() == Some(&key)).map(|s| s.at).collect();
        assert!(tries.len() >= 2, "{key} was retried under its key: {tries:?}");
        let gap = tries[1] - tries[0];
        assert!(gap >= Duration::from_millis(RETRY_AFTER_MS), "{key}: retried after {gap:?}, before retry_after");
        let ok = seen.iter().filter(|s| s.key.as_deref() == Some(&key) && s.status == 200).count();
        assert_eq!(ok, 1, "{key}: acked once it was taken, no more sends");
    }

    backend.set(Behave::Status(422));
    let u = uplink.clone();
    let refused = rt.block_on(async { tokio::time::timeout(SLACK * 3, u.send(9, json!({}))).await }).expect("answered");
    assert_eq!(refused, UpResult::Refused { reason: "rejected".into(), status: Some(422) });
    assert_eq!(backend.seen().iter().filter(|s| s.key.as_deref() == Some("dev1:9")).count(), 1, "no retry of a 4xx");
    stop.cancel();
    let _ = rt.block_on(async { tokio::time::timeout(SLACK, running).await });
}
