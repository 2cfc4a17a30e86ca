//! A node bounds the bytes of `sync` pages it reads and holds at once (`--sync-buffer-bytes`,
//! issue 12): with a budget of one page and a device stalled in the middle of its backlog (it
//! stopped reading, so its page is still being written), another device's sync is not read: it
//! gets `sync_busy` with a retry hint and the node resumes that sync by itself once the page is
//! written. Both devices then get every retained message once, in order. Without the budget the
//! second sync is read at once, however many pages are held.

mod common;

use std::time::{Duration, Instant};

use common::raw::{connect, upgrade, Raw};
use common::ws::{Dial, Event};
use common::{wait_until, Cluster, Start, SLACK};
use serde_json::{json, Value};

/// One sync page (the node's `SYNC_PAGE_BYTES`): the whole budget here.
const PAGE_BYTES: usize = 256 << 10;
/// Messages in the stalled device's backlog, each `PAD` bytes: 7 MB, more than loopback buffers
/// (the sender's buffer autotunes up to 4 MiB here) take from a device that does not read.
const BACKLOG: u64 = 120;
const PAD: usize = 60_000;

#[test]
fn a_spent_sync_budget_pauses_other_syncs_and_loses_nothing() {
    let budget = PAGE_BYTES.to_string();
    let mut c = Cluster::with_args(&["--sync-buffer-bytes", &budget]);
    c.spawn("n1", Start::Bootstrap);
    let addr = c.public_addr(0);
    let (slow_token, other_token) = (c.token("slow", 0), c.token("other", 0));
    // Streams exist once a device has connected.
    drop(c.dial(0, "/ws?attempt=1", &Dial::token(&slow_token)).open("slow, first"));
    drop(c.dial(0, "/ws?attempt=1", &Dial::token(&other_token)).open("other, first"));
    for i in 1..=BACKLOG {
        assert_eq!(c.publish_ok(&[0], "slow", &json!({ "i": i, "pad": "x".repeat(PAD) }), &format!("s{i}")), i);
    }
    for i in 1..=2 {
        assert_eq!(c.publish_ok(&[0], "other", &json!({ "i": i }), &format!("o{i}")), i);
    }

    // The slow device syncs with a 4 KiB receive window and reads nothing: its first page is
    // read (holding the whole budget) and its write stalls.
    let stream = connect(addr, None, Some(4096));
    let (status, head) = upgrade(&stream, addr, &slow_token, 2);
    assert_eq!(status, 101, "{head}");
    let mut slow = Raw { stream };
    assert!(slow.text(br#"{"t":"sync","after":0}"#), "sync sent");
    let read = || c.metric_labeled(0, "gateway_sync_pages_total", "result=\"read\"").unwrap_or(0.0);
    // Pages go out until the socket's buffers fill; then one stays held. Stalled = no new page
    // read for 300 ms (a page is read and written in a few ms while the device still takes bytes).
    let mut last = -1.0;
    let stalled = wait_until(SLACK * 2, "the slow device's sync to stall", || {
        std::thread::sleep(Duration::from_millis(300));
        let now = read();
        let stable = now >= 1.0 && now == last;
        last = now;
        if stable {
            Ok(now)
        } else {
            Err(now)
        }
    });
    println!("[sync_budget] the slow device stalled after {stalled} pages read");
    assert!(stalled < (BACKLOG as usize * PAD / PAGE_BYTES + 1) as f64, "its whole backlog went out: {stalled} pages");

    // The other device's sync finds no room: sync_busy with a hint, and no message yet.
    let mut other = c.dial(0, "/ws?attempt=2", &Dial::token(&other_token)).open("other, second");
    assert_eq!(other.hello()["stream_head"], 2);
    other.send_json(&json!({"t": "sync", "after": 0})).unwrap();
    let busy = loop {
        match other.next_event(SLACK) {
            Event::Text(v) if v["t"] == "sync_busy" => break v,
            Event::Ping | Event::Pong => {}
            e => panic!("expected sync_busy while the budget is held, got {e:?}"),
        }
    };
    let hint = busy["retry_after_ms"].as_u64().expect("retry_after_ms");
    // One page of budget: the hint is 8x the 100 ms base, jittered by half.
    assert!((400..=1200).contains(&hint), "{busy}");
    let busy_pages = c.metric_labeled(0, "gateway_sync_pages_total", "result=\"busy\"").unwrap_or(0.0);
    assert!(busy_pages >= 1.0, "busy pages counted: {busy_pages}");
    // Still held: nothing arrives while the slow device does not read (a bounded look, the hint).
    match other.next_event(Duration::from_millis(hint)) {
        Event::Timeout | Event::Ping | Event::Pong => {}
        e => panic!("a message went out while the budget was held: {e:?}"),
    }

    // The slow device reads: every message once, in order; the pages free the budget.
    let started = Instant::now();
    let mut seqs = Vec::new();
    while (seqs.len() as u64) < BACKLOG {
        let (opcode, payload) = slow.next_frame(SLACK).unwrap_or_else(|| panic!("slow device: stalled after {seqs:?}"));
        if opcode == 0x1 {
            let v: Value = serde_json::from_slice(&payload).expect("json frame");
            if v["t"] == "msg" {
                assert_eq!(v["payload"]["i"].as_u64(), v["seq"].as_u64(), "{}", v["seq"]);
                seqs.push(v["seq"].as_u64().unwrap());
            }
        }
    }
    assert_eq!(seqs, (1..=BACKLOG).collect::<Vec<_>>());
    println!("[sync_budget] slow device drained {BACKLOG} messages in {:?}", started.elapsed());

    // The paused sync resumes by itself: the other device gets 1, 2 once, without asking again.
    let bound = Duration::from_millis(2 * hint) + SLACK;
    let mut got = Vec::new();
    let deadline = Instant::now() + bound;
    while got.len() < 2 {
        match other.next_event(deadline.saturating_duration_since(Instant::now())) {
            Event::Text(v) if v["t"] == "msg" => got.push(v["seq"].as_u64().unwrap()),
            Event::Text(v) if v["t"] == "sync_busy" => panic!("told busy twice in one pause streak: {v}"),
            Event::Text(_) | Event::Ping | Event::Pong => {}
            e => panic!("other device: expected its backlog within {bound:?}, got {e:?} after {got:?}"),
        }
    }
    assert_eq!(got, vec![1, 2]);
    match other.next_event(Duration::from_millis(300)) {
        Event::Timeout | Event::Ping | Event::Pong => {}
        e => panic!("nothing more expected: {e:?}"),
    }
}
