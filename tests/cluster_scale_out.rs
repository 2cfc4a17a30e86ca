//! Issue 15, scale-out: a fourth node joins while devices keep arriving. It takes new devices
//! only (placement steers arrivals to it), and no connected device is disturbed: no frame, no
//! close, and its route version unchanged. The join is in the replicated event log.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::ws::{Event, Ws};
use common::{Cluster, Start, TIMING};

const BEFORE: usize = 12;
const AFTER: usize = 16;

/// Connects a new device as a client does (from node `start`, following 307): the node it got.
fn connect(c: &Cluster, device: &str, start: usize) -> (Ws, String) {
    let token = c.token(device, 0);
    let mut ws = c.connect_following(device, &token, start, &mut 0);
    let hello = ws.hello();
    let name = hello["node"].as_str().unwrap_or_default().to_string();
    (ws, name)
}

fn route_version(c: &Cluster, device: &str) -> (String, u64) {
    let (code, r) = c.route(0, device);
    assert_eq!(code, 200, "{device}: {r}");
    (r["node"]["name"].as_str().unwrap().to_string(), r["version"].as_u64().unwrap())
}

#[test]
fn a_fourth_node_takes_new_devices_and_moves_none() {
    let (mut c, _) = Cluster::form(3, &[]);
    let mut held: Vec<(String, Ws, (String, u64))> = Vec::new();
    for k in 0..BEFORE {
        let device = format!("so-old{k}");
        let (ws, node) = connect(&c, &device, k % 3);
        let route = route_version(&c, &device);
        assert_eq!(route.0, node);
        held.push((device, ws, route));
    }

    // The join, while devices keep arriving through n1..n3.
    let n4 = c.spawn("n4", Start::Standby);
    let mut arrivals: Vec<(String, Ws, String)> = Vec::new();
    let mut joiner = Some(c.cli_background(&[
        "join",
        "--cluster",
        &c.nodes[0].cluster_addr_str(),
        "--node",
        &c.nodes[n4].cluster_addr_str(),
    ]));
    let mut k = 0;
    while arrivals.len() < AFTER {
        let device = format!("so-new{k}");
        let (ws, node) = connect(&c, &device, k % 3);
        arrivals.push((device, ws, node));
        k += 1;
        // Arrivals that land after n4 is in the ring count toward what it takes; keep the first
        // half of the arrivals flowing during the join itself.
        if joiner.is_some() && arrivals.len() >= AFTER / 2 {
            let out = joiner.take().unwrap().wait(TIMING.settle_bound());
            assert_eq!(out.code, Some(0), "join failed: {out:#?}");
            c.wait_agreement(&[0, 1, 2, 3], TIMING.settle_bound(), "n4 live in the ring everywhere", |v| {
                v.ring_live == ["n1", "n2", "n3", "n4"]
            });
            arrivals.clear(); // count only those placed with n4 in the ring
        }
    }
    let on_n4 = arrivals.iter().filter(|(_, _, n)| n == "n4").count();
    let per_node: BTreeMap<&str, usize> = arrivals.iter().fold(BTreeMap::new(), |mut m, (_, _, n)| {
        *m.entry(n.as_str()).or_default() += 1;
        m
    });
    println!("[scale_out] {AFTER} arrivals after the join: {per_node:?}");
    assert!(on_n4 >= AFTER / 4, "n4 takes at least its share of new devices: {per_node:?}");

    // No connected device moved: no frame, no close, same node and route version.
    for (device, ws, (node, version)) in &mut held {
        match ws.next_event(Duration::from_millis(1)) {
            Event::Timeout => {}
            other => panic!("{device} on {node} was disturbed by the join: {other:?}"),
        }
        assert_eq!(route_version(&c, device), (node.clone(), *version), "{device} moved");
    }
    // The join is in the replicated log.
    let out = c.cli_auth(&["events", "--cluster", &c.nodes[n4].cluster_addr_str()]);
    assert_eq!(out.code, Some(0), "{out:#?}");
    assert!(out.stdout.contains("n4 added as a learner"), "{}", out.stdout);
    assert!(out.stdout.contains("n4 renewed its first lease"), "{}", out.stdout);
}
