//! A fourth node joins while claims flow: it becomes a learner (three voters at most), agrees with
//! the others, and no accepted claim is lost.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::{reply_node_id, wait_until, Api, Cluster, Rng, Start, TIMING};

/// What a writer knows about one of its devices.
#[derive(Debug, Clone, Default)]
struct Known {
    attempt: u64,
    /// (node id, conn, version) of the last accepted claim.
    accepted: Option<(u64, u64, u64)>,
    /// A claim after the last accepted one had no answer (timeout/reset): it may or may not have
    /// committed, so only "version >= accepted" can be checked.
    unknown_after: bool,
}

struct Counters {
    accepted: AtomicU64,
    unavailable: AtomicU64,
    unknown: AtomicU64,
    stale: AtomicU64,
}

const WRITERS: u64 = 2;
const DEVICES_PER_WRITER: u64 = 40;

fn writer(
    w: u64,
    api: Api,
    targets: Arc<Mutex<Vec<(SocketAddr, u64)>>>,
    stop: Arc<AtomicBool>,
    n: Arc<Counters>,
) -> HashMap<String, Known> {
    let mut rng = Rng::new(0x5eed ^ ((w + 1) * 7919));
    let mut known: HashMap<String, Known> = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        let device = format!("w{w}-d{}", rng.below(DEVICES_PER_WRITER));
        let (addr, node_id) = {
            let t = targets.lock().unwrap();
            t[rng.below(t.len() as u64) as usize]
        };
        let k = known.entry(device.clone()).or_default();
        k.attempt += 1;
        let conn = rng.next() >> 1;
        match api.try_claim(addr, &device, conn, 0, k.attempt) {
            Ok((200, v)) => {
                let version = v["version"].as_u64().unwrap_or_else(|| panic!("accepted without version: {v}"));
                assert_eq!(reply_node_id(&v), Some(node_id), "claim on {addr} must be for that node: {v}");
                if let Some((_, _, prev)) = k.accepted {
                    assert!(version > prev, "{device}: version went from {prev} to {version} (V1)");
                }
                k.accepted = Some((node_id, conn, version));
                k.unknown_after = false;
                n.accepted.fetch_add(1, Ordering::Relaxed);
            }
            Ok((503, _)) => {
                // Refused before commit (or unknown?) — the contract says 503 means it could not commit in
                // time, which may still commit later: treat as unknown for the final check.
                k.unknown_after = true;
                n.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Ok((409, v)) => {
                // Attempts only grow per device and one writer owns each device: never stale.
                n.stale.fetch_add(1, Ordering::Relaxed);
                panic!("{device} attempt {} stale: {v}", k.attempt);
            }
            Ok((code, v)) => panic!("claim {device} on {addr}: unexpected {code} {v}"),
            Err(_) => {
                k.unknown_after = true;
                n.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    known
}

#[test]
fn fourth_node_joins_as_learner_while_claims_flow() {
    let (mut c, _) = Cluster::form(3, &[]);
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let targets = Arc::new(Mutex::new((0..3).map(|i| (c.nodes[i].cluster_addr(), ids[i])).collect::<Vec<_>>()));
    let stop = Arc::new(AtomicBool::new(false));
    let n = Arc::new(Counters {
        accepted: AtomicU64::new(0),
        unavailable: AtomicU64::new(0),
        unknown: AtomicU64::new(0),
        stale: AtomicU64::new(0),
    });
    let started = Instant::now();
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (api, t, s, n) = (c.api(), targets.clone(), stop.clone(), n.clone());
            std::thread::spawn(move || writer(w, api, t, s, n))
        })
        .collect();

    // Writes are flowing before the join starts.
    wait_until(TIMING.settle_bound(), "first 20 accepted claims", || {
        assert!(!handles.iter().any(|h| h.is_finished()), "a writer died (see its panic above)");
        let a = n.accepted.load(Ordering::Relaxed);
        if a >= 20 {
            Ok(())
        } else {
            Err(a)
        }
    });

    let n4 = c.spawn("n4", Start::Standby);
    let join_started = Instant::now();
    c.join(0, n4);
    let all = [0, 1, 2, 3];
    let view = c.wait_agreement(&all, TIMING.settle_bound(), "4 members, n4 a learner, all live, on every node", |v| {
        v.members.len() == 4
            && v.voters() == 3
            && v.member("n4").is_some_and(|m| m.role == "learner")
            && v.all_live()
            && v.ring_live == ["n1", "n2", "n3", "n4"]
    });
    println!("n4 joined and all agree after {:?} (ring version {})", join_started.elapsed(), view.ring_version);
    let n4_id = c.node_id(n4);
    assert_eq!(view.member("n4").unwrap().id, n4_id);

    // The learner takes writes too; keep going until a few more have landed.
    targets.lock().unwrap().push((c.nodes[n4].cluster_addr(), n4_id));
    let at_join = n.accepted.load(Ordering::Relaxed);
    wait_until(TIMING.settle_bound(), "40 more accepted claims after the join", || {
        assert!(!handles.iter().any(|h| h.is_finished()), "a writer died (see its panic above)");
        let a = n.accepted.load(Ordering::Relaxed);
        if a >= at_join + 40 {
            Ok(())
        } else {
            Err(a)
        }
    });
    stop.store(true, Ordering::Relaxed);
    let mut known: HashMap<String, Known> = HashMap::new();
    for h in handles {
        known.extend(h.join().expect("writer panicked"));
    }
    let elapsed = started.elapsed();
    println!(
        "claims: {} accepted, {} unavailable, {} unanswered, {} stale in {elapsed:?}",
        n.accepted.load(Ordering::Relaxed),
        n.unavailable.load(Ordering::Relaxed),
        n.unknown.load(Ordering::Relaxed),
        n.stale.load(Ordering::Relaxed)
    );

    // Every node (the learner included) has applied everything committed, and serves each device's
    // last accepted claim.
    let commit = c.leader_commit_index(0);
    let api = c.api();
    for i in all {
        c.wait_applied(i, commit, TIMING.settle_bound());
        for (device, k) in &known {
            let Some((node, conn, version)) = k.accepted else {
                continue;
            };
            let (code, v) = api.try_route(c.nodes[i].cluster_addr(), device).unwrap();
            assert_eq!(code, 200, "{device} on {}: route lost: {v}", c.nodes[i].name);
            let got = v["version"].as_u64().unwrap();
            if k.unknown_after {
                assert!(got >= version, "{device} on {}: version {got} < accepted {version}", c.nodes[i].name);
            } else {
                assert_eq!(
                    (reply_node_id(&v), v["conn"].as_u64(), got),
                    (Some(node), Some(conn), version),
                    "{device} on {}: route {v}",
                    c.nodes[i].name
                );
            }
        }
    }
}
