//! Failure suspicion (issue 9): a member that stops answering the leader leaves the ring on every
//! node within about two election timeouts — long before its lease lapses; one whose cluster port
//! refuses connections (killed) within two heartbeats, counted as `refused` — while keeping its
//! lease and routes; its own renewal brings it back after the hold (its restart releases the routes
//! its killed process left), and a node paused briefly and often is never swept and moves the ring
//! a bounded number of times.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{reply_node_id, wait_until, Cluster, SLACK, TIMING};

/// How fast every survivor must drop a silent member from the ring: the leader suspects after an
/// election timeout without an answer; the design target is 2 × election timeout + 0.5 s. On a
/// loaded 2-core test machine: plus a second, still well inside the lease (the old path).
fn suspect_bound() -> Duration {
    Duration::from_millis(2 * TIMING.election_timeout_ms + 500) + Duration::from_secs(1)
}

/// The follower to fail, the survivors, and its name.
fn follower(c: &Cluster, leader: u64) -> (usize, Vec<usize>, String) {
    let f = (0..3).rev().find(|&i| c.node_id(i) != leader).unwrap();
    (f, (0..3).filter(|&i| i != f).collect(), c.nodes[f].name.clone())
}

/// The routes the survivors' status shows for `name`.
fn routes_of(c: &Cluster, on: usize, name: &str) -> Option<u64> {
    let s = c.try_status(on).ok()?;
    s["members"].as_array()?.iter().find(|m| m["name"] == name)?["routes"].as_u64()
}

/// The suspicions the survivors counted with this `reason`.
fn suspicions(c: &Cluster, survivors: &[usize], reason: &str) -> f64 {
    let labels = format!(r#"reason="{reason}""#);
    survivors.iter().filter_map(|&i| c.metric_labeled(i, "gateway_suspicions_total", &labels)).sum()
}

#[test]
fn a_killed_follower_leaves_the_ring_in_seconds_keeps_its_routes_and_rejoins_after_restart() {
    assert!(suspect_bound() < Duration::from_millis(TIMING.lease_ms), "the bound must beat the lease path");
    let (mut c, view) = Cluster::form(3, &[]);
    let (f, survivors, name) = follower(&c, view.leader.unwrap());
    for k in 0..5u64 {
        let v = c.claim_accepted(f, &format!("s-d{k}"), 100 + k, 0, 1, TIMING.settle_bound());
        assert_eq!(reply_node_id(&v), Some(c.node_id(f)));
    }
    wait_until(TIMING.settle_bound(), "the follower's routes to show", || match routes_of(&c, survivors[0], &name) {
        Some(5) => Ok(()),
        other => Err(other),
    });

    c.kill9(f);
    let killed = Instant::now();
    let out = c.wait_agreement(&survivors, suspect_bound() + SLACK, &format!("survivors to drop {name}"), |v| {
        !v.ring_live.contains(&name)
    });
    let took = killed.elapsed();
    println!("suspect: {name} out of every survivor's ring {took:?} after kill -9 (bound {:?})", suspect_bound());
    assert_eq!(out.member(&name).map(|m| m.state.as_str()), Some("suspect"), "dropped by suspicion, not by a sweep");
    assert!(took <= suspect_bound(), "took {took:?}, bound {:?}", suspect_bound());
    assert_eq!(routes_of(&c, survivors[0], &name), Some(5), "a suspect keeps its routes until a sweep");
    // Its port refused the leader's probes (nothing listens there): suspected for that, before
    // a window of silence ran out.
    let by = |reason: &str| suspicions(&c, &survivors, reason);
    assert!(by("refused") >= 1.0, "the leader counted the suspicion as refused (silent: {})", by("silent"));
    assert_eq!(c.metric(survivors[0], "gateway_suspect_nodes"), Some(1.0));

    // Restarted on its data dir, it renews; after the hold it is live and in the ring again.
    let down_for = killed.elapsed();
    c.start(f);
    let back = Instant::now();
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), &format!("{name} live again"), |v| {
        v.all_live() && v.ring_live.contains(&name)
    });
    println!("suspect: {name} back in every ring {:?} after its restart", back.elapsed());
    // Restarted within its lease, it renewed that lease: no sweep will ever delete the routes its
    // killed process left. Its first renewal releases them (before it serves); the floors stay.
    wait_until(TIMING.failover_bound(), "the restarted node's old routes released", || {
        match routes_of(&c, survivors[0], &name) {
            Some(0) => Ok(()),
            other => Err(other),
        }
    });
    for k in 0..5u64 {
        let (status, v) = c.route(survivors[1], &format!("s-d{k}"));
        assert_eq!((status, v["error"].as_str()), (404, Some("no_route")), "s-d{k}: {v}");
        assert_eq!(v["floor"]["attempt"].as_u64(), Some(1), "s-d{k} keeps its floor: {v}");
    }
    // Down for less than 4/5 of a lease (its last renewal may have been sent a renewal period
    // before the kill), no sweep could have deleted them: its first renewal did.
    if down_for < Duration::from_millis(TIMING.lease_ms * 4 / 5) {
        let log = std::fs::read_to_string(&c.nodes[f].stderr_path).unwrap_or_default();
        assert!(
            log.contains("released the routes this node's previous process left routes=5"),
            "the restarted node's first renewal released them:\n{}",
            common::tail(&c.nodes[f].stderr_path, 20)
        );
    } else {
        println!("suspect: {name} was down {down_for:?}, past its lease: a sweep may have released its routes");
    }
    println!("suspect: {name}'s old routes released {:?} after its restart", back.elapsed());
}

#[test]
fn a_node_paused_briefly_and_often_is_never_swept_and_moves_the_ring_boundedly() {
    const CYCLES: usize = 3;
    // Long enough to be suspected, far shorter than the lease (and than its own fencing).
    let pause = Duration::from_millis(3 * TIMING.election_timeout_ms);
    assert!(pause * 2 < Duration::from_millis(TIMING.lease_ms));
    let (c, view) = Cluster::form(3, &[]);
    let (f, survivors, name) = follower(&c, view.leader.unwrap());
    for k in 0..3u64 {
        c.claim_accepted(f, &format!("p-d{k}"), 200 + k, 0, 1, TIMING.settle_bound());
    }
    // Watch one survivor's view of the flapping node: in the ring or not, and its state.
    let watching = Arc::new(AtomicBool::new(true));
    let seen = Arc::new(Mutex::new(Vec::<(bool, String)>::new()));
    let api = c.api();
    let observer = {
        let (watching, seen, addr, name) =
            (watching.clone(), seen.clone(), c.nodes[survivors[0]].cluster_addr(), name.clone());
        std::thread::spawn(move || {
            while watching.load(Ordering::Relaxed) {
                if let Ok(s) = api.status(addr) {
                    let in_ring = s["ring"]["live"].as_array().is_some_and(|l| l.iter().any(|n| n == name.as_str()));
                    let state = s["members"]
                        .as_array()
                        .and_then(|ms| ms.iter().find(|m| m["name"] == name.as_str()))
                        .and_then(|m| m["state"].as_str())
                        .unwrap_or("")
                        .to_string();
                    seen.lock().unwrap().push((in_ring, state));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    for _ in 0..CYCLES {
        // The pauses are the scenario, not a wait for a condition.
        c.sigstop(f);
        std::thread::sleep(pause);
        c.sigcont(f);
        std::thread::sleep(pause);
    }
    c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), &format!("{name} live again"), |v| {
        v.all_live() && v.ring_live.contains(&name)
    });
    watching.store(false, Ordering::Relaxed);
    observer.join().unwrap();
    let seen = seen.lock().unwrap();
    let changes = seen.windows(2).filter(|w| w[0].0 != w[1].0).count();
    let states: std::collections::BTreeSet<&str> = seen.iter().map(|(_, s)| s.as_str()).collect();
    println!(
        "flapping: {CYCLES} pauses of {pause:?}: {changes} ring changes seen, states {states:?}, {} samples",
        seen.len()
    );
    assert!(!states.contains("expired"), "a node paused for less than a lease was swept");
    assert!(states.contains("suspect"), "pauses of {pause:?} should be suspected");
    // A paused process's port still accepts connections (the kernel answers for it): each pause
    // was suspected as silent, never as refused.
    let by = |reason: &str| suspicions(&c, &survivors, reason);
    assert!(by("silent") >= 1.0 && by("refused") == 0.0, "silent {}, refused {}", by("silent"), by("refused"));
    assert!(changes <= 2 * CYCLES, "{changes} ring changes for {CYCLES} pauses");
    for k in 0..3u64 {
        let (status, v) = c.route(survivors[1], &format!("p-d{k}"));
        assert_eq!((status, reply_node_id(&v)), (200, Some(c.node_id(f))), "p-d{k} kept its route");
    }
}
