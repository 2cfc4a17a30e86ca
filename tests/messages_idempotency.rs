//! Idempotency keys outlive their messages (issue 10): a backend's retry with the same
//! `Idempotency-Key` is a duplicate — same seq, delivered once — after the message was delivered
//! and trimmed from the stream, for `--idempotency-ms`; after that window the key is new again.

mod client_util;
mod common;

use std::time::Duration;

use client_util::{config, holds, received, start};
use common::{wait_until, Cluster, TIMING};
use gateway::client::device::{Event, MemoryStore};
use serde_json::json;

const WINDOW_MS: u64 = 1_500;

#[test]
fn a_retry_after_the_message_was_trimmed_is_still_a_duplicate_within_the_window() {
    // One message retained per device: the next publish trims the previous one.
    let window = WINDOW_MS.to_string();
    let (c, _) = Cluster::form(1, &["--retain-count", "1", "--idempotency-ms", &window]);
    let d = "idem-1";
    let mut dev = start(d, config(&c.public_url(0), d, &c.token(d, 0), 0, 1), Box::new(MemoryStore(0)));
    dev.wait_for(TIMING.settle_bound(), "connect", |e| matches!(e, Event::Connected { .. }));

    let first = c.publish(0, d, &json!({"order": 17}), Some("order-17"));
    assert_eq!((first.0, first.1["seq"].as_u64(), first.1["duplicate"].as_bool()), (200, Some(1), Some(false)));
    let second = c.publish(0, d, &json!({"order": 18}), Some("order-18"));
    assert_eq!(second.1["seq"].as_u64(), Some(2), "{second:?}");
    // Seq 1 is no longer retained; its key still is.
    let retry = c.publish(0, d, &json!({"order": 17}), Some("order-17"));
    assert_eq!(
        (retry.0, retry.1["seq"].as_u64(), retry.1["duplicate"].as_bool()),
        (200, Some(1), Some(true)),
        "{retry:?}"
    );
    wait_until(TIMING.settle_bound(), "both messages delivered", || holds(&mut dev, 2));

    // Past the window the key is forgotten: the same key makes a new message. (The wait is the
    // scenario: time has to pass.)
    std::thread::sleep(Duration::from_millis(WINDOW_MS + 200));
    let late = c.publish(0, d, &json!({"order": 17}), Some("order-17"));
    assert_eq!((late.1["seq"].as_u64(), late.1["duplicate"].as_bool()), (Some(3), Some(false)), "{late:?}");
    wait_until(TIMING.settle_bound(), "the new message delivered", || holds(&mut dev, 3));
    let seqs: Vec<u64> = received(&mut dev).iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, [1, 2, 3], "each message delivered once");
}
