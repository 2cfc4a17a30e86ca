//! `serve --join ADDR`: a node adds itself (through a follower too), keeps its membership across a
//! restart that still carries the flag, and `gateway watch` redraws the view as it changes.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bin, Cluster, Start, TIMING};

#[test]
fn nodes_started_with_join_become_voters_and_watch_redraws() {
    let mut c = Cluster::new();
    c.spawn("n1", Start::Bootstrap);
    let started = Instant::now();
    c.spawn("n2", Start::Join(0));
    // n3 asks n2, a follower once n2 is in: the join is relayed to the leader.
    c.spawn("n3", Start::Join(1));
    let all = [0, 1, 2];
    let view = c.wait_agreement(&all, TIMING.settle_bound(), "n2 and n3 voters by --join", |v| {
        v.members.len() == 3 && v.voters() == 3 && v.all_live()
    });
    println!("--join: 3 voters, all live after {:?}", started.elapsed());

    // A restart that still carries --join keeps the same identity and membership.
    let n2_id = c.node_id(1);
    c.kill9(1);
    c.start(1);
    let after = c.wait_agreement(&all, TIMING.settle_bound(), "n2 back as the same voter", |v| {
        v.members.len() == 3 && v.voters() == 3 && v.all_live()
    });
    assert_eq!(c.node_id(1), n2_id, "restart keeps the node id");
    assert_eq!(after.ids(), view.ids(), "restart with --join changed the membership");

    // `gateway watch` redraws about every 250 ms: at least 4 frames in 2.5 s (honest slack for load).
    let mut child = Command::new(bin())
        .args(["watch", "--cluster", &c.nodes[0].cluster_addr_str(), "--cluster-secret-file"])
        .arg(&c.secret_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gateway watch");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let deadline = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < deadline {
            match stdout.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf
    });
    std::thread::sleep(Duration::from_millis(2500)); // the observation window is the scenario
    let _ = child.kill();
    let _ = child.wait();
    let out = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    let frames = out.matches("ring version").count();
    println!("watch drew {frames} frames in 2.5 s");
    assert!(frames >= 4, "watch should redraw about every 250 ms; got {frames} frames:\n{out}");
    for name in ["n1", "n2", "n3"] {
        assert!(out.contains(name), "watch shows member {name}");
    }
}
