//! Issue 4 "must show": clients refused with `429 Retry-After` wait at least what they were told
//! before their next dial, and still get in once tokens refill. One node with `--admit-rate 0.5
//! --admit-burst 1`: one handshake every 2 s. The node paces its refusals (`retry_after_ms`):
//! devices refused together are told turns one token (2 s) apart, and the client keeps its turn.
//! The overload gate is off (`--overload-commit-ms 0`): on a loaded machine a slow commit made it
//! refuse a handshake `503 overloaded`, which is its own test's subject (`device_overload.rs`).

mod client_util;
mod common;

use std::time::Duration;

use client_util::{config, ms, start};
use common::{Cluster, SLACK};
use gateway::client::device::{Event, MemoryStore, StopReason};

const REFUSED: usize = 3;

#[test]
fn refused_clients_wait_at_least_retry_after_then_connect() {
    let (c, _) = Cluster::form(1, &["--admit-rate", "0.5", "--admit-burst", "1", "--overload-commit-ms", "0"]);
    let url = c.public_url(0);

    // The first device takes the only token.
    let first = {
        let t = c.token("ra0", 0);
        let mut d = start("ra0", config(&url, "ra0", &t, 0, 100), Box::new(MemoryStore::new(0)));
        d.wait_for(SLACK, "ra0 connected", |e| matches!(e, Event::Connected { .. }));
        d
    };
    assert_eq!(first.count(|e| matches!(e, Event::Refused { .. })), 0, "the full bucket admits the first");

    // The rest arrive while the bucket is empty: each is told 429 with Retry-After.
    let tokens: Vec<String> = (1..=REFUSED).map(|k| c.token(&format!("ra{k}"), 0)).collect();
    let mut devices: Vec<_> = (1..=REFUSED)
        .map(|k| {
            let name = format!("ra{k}");
            start(&name, config(&url, &name, &tokens[k - 1], 0, 100 + k as u64), Box::new(MemoryStore::new(0)))
        })
        .collect();
    // Every token refill admits one device: REFUSED devices need about 2·REFUSED s, plus jitter.
    let bound = Duration::from_secs(2 * REFUSED as u64 + 8) + SLACK;
    for d in &mut devices {
        d.wait_for(bound, "connected", |e| matches!(e, Event::Connected { .. }));
    }

    let mut first_ras = Vec::new();
    let mut first_turns = Vec::new();
    let mut min_slack = Duration::MAX;
    let mut total_refusals = 0;
    for d in devices {
        let (_, log) = d.shutdown(SLACK);
        // Each refusal's Retry-After is a floor: the next dial comes at least that much later.
        let mut refusals = 0;
        for (k, (at, e)) in log.iter().enumerate() {
            let Event::Refused { status, reason, retry_after } = e else { continue };
            assert_eq!((*status, reason.as_str()), (429, "rate_limited"), "{log:#?}");
            let ra = retry_after.expect("a 429 carries Retry-After");
            if refusals == 0 {
                first_ras.push(ra);
                first_turns.push(*at + ra);
            }
            refusals += 1;
            let (waited_at, delay) = log[k..]
                .iter()
                .find_map(|(t, e)| match e {
                    Event::Waiting { delay, why: "rate_limited" } => Some((*t, *delay)),
                    _ => None,
                })
                .expect("a refusal is followed by a wait");
            assert!(delay >= ra, "the wait {delay:?} is below Retry-After {ra:?}");
            let next_dial = log[k..]
                .iter()
                .find_map(|(t, e)| matches!(e, Event::Dialing { .. }).then_some(*t))
                .expect("a wait is followed by a dial");
            let gap = next_dial - *at;
            assert!(gap >= ra, "next dial {gap:?} after a 429 with Retry-After {ra:?}: {log:#?}");
            assert!(next_dial >= waited_at);
            min_slack = min_slack.min(gap - ra);
        }
        assert!(refusals >= 1, "with the bucket empty every later device is refused at least once: {log:#?}");
        total_refusals += refusals;
        let attempts = log.iter().filter(|(_, e)| matches!(e, Event::Dialing { .. })).count();
        assert_eq!(attempts, refusals + 1, "every dial but the last was refused: {log:#?}");
        assert_eq!(log.last().map(|(_, e)| e), Some(&Event::Stopped(StopReason::Shutdown)));
    }
    // The first refusals came while the only token was gone: the first one was told the next
    // token (due 2 s after the first device took it), each later one the token after: turns
    // 2 s apart, as the client saw them (give or take the loopback's delivery of each answer).
    first_turns.sort();
    let told = first_ras.iter().min().copied().unwrap_or_default();
    assert!(
        told > Duration::from_secs(1) && told <= Duration::from_secs(2),
        "the first turn at an empty 0.5/s bucket: {first_ras:?}"
    );
    for pair in first_turns.windows(2) {
        let apart = pair[1] - pair[0];
        assert!(
            apart.abs_diff(Duration::from_secs(2)) < Duration::from_millis(500),
            "turns {apart:?} apart: {first_ras:?}"
        );
    }
    println!(
        "[client_retry_after] {REFUSED} devices refused {total_refusals} times; first Retry-After {:?}; \
         every next dial came at least Retry-After later (smallest margin {})",
        first_ras,
        ms(min_slack)
    );
    drop(first);
}
