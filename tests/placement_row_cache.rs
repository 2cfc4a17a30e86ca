//! Placement reads a device's route and floor before a steered handshake. The node answers that
//! from the rows its own applies wrote (the store's row cache) and reads the store only for a
//! device whose row it does not hold: `gateway_placement_reads_total{result="cache"|"store"}`.

mod common;

use common::ws::{Dial, Outcome};
use common::{wait_until, Cluster, Start, SLACK, TIMING};

const READS: &str = "gateway_placement_reads_total";

/// (cache, store) placement reads of node `i`.
fn reads(c: &Cluster, i: usize) -> (f64, f64) {
    let n = |result: &str| c.metric_labeled(i, READS, &format!("result=\"{result}\"")).unwrap_or(0.0);
    (n("cache"), n("store"))
}

#[test]
fn a_reconnect_is_placed_from_memory_and_a_restart_keeps_the_rows() {
    let mut c = Cluster::new();
    c.spawn("n1", Start::Bootstrap);
    let token = c.token("rc1", 1);
    let first = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("first connection");
    assert_eq!(reads(&c, 0), (0.0, 1.0), "a device never claimed is read from the store: (cache, store)");
    drop(first);
    let second = c.dial(0, "/ws?attempt=2", &Dial::token(&token)).open("second connection");
    assert_eq!(reads(&c, 0), (1.0, 1.0), "its claim's apply left its row in memory: (cache, store)");
    drop(second);

    c.sigterm(0);
    c.wait_exit(0, TIMING.settle_bound());
    c.start(0);
    let mut attempt = 2;
    wait_until(TIMING.settle_bound(), "rc1 to connect after the restart", || {
        attempt += 1;
        match c.dial(0, &format!("/ws?attempt={attempt}"), &Dial::token(&token)) {
            Outcome::Open(ws) => Ok(ws),
            Outcome::Refused(r) => Err(format!("{} {}", r.status, r.error())),
        }
    });
    let (cache, store) = reads(&c, 0);
    println!("[placement_row_cache] after the restart: {cache} placement reads from memory, {store} from the store");
    assert!(
        cache >= 1.0 && store == 0.0,
        "the open put the stored rows in memory: (cache, store) = ({cache}, {store})"
    );
}

#[test]
fn a_follower_steers_a_device_to_its_route_from_the_rows_it_applied() {
    let (c, _) = Cluster::form(3, &[]);
    let (n1, n2) = (0, 1);
    let token = c.token("rc2", 1);
    let _held = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token)).open("rc2 on n1");
    // n2 has applied the claim once its route shows n1 (a read transaction, not placement).
    wait_until(SLACK, "n2 to show rc2's route on n1", || match c.try_route(n2, "rc2") {
        Ok((200, r)) if r["node"]["name"] == "n1" => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let before = reads(&c, n2);
    let r = c.dial(n2, "/ws?attempt=2", &Dial::token(&token)).refused("steered handshake on n2");
    assert_eq!(r.status, 307, "{r:?}");
    assert_eq!(r.header("location"), Some(format!("{}/ws?attempt=2", c.public_url(n1)).as_str()), "{r:?}");
    let after = reads(&c, n2);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1.0, 0.0), "n2 placed rc2 from memory: (cache, store)");
}
