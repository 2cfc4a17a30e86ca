//! The cluster listener serves its first sixteen open connections on Raft's runtime (one worker,
//! threads named `cluster`) and every connection past them on the `cluster-api` runtime's
//! workers (`gateway::server::spill`). What an operator relies on: a backend holding many
//! connections open at once gets every one of them served, each answering claim after claim on
//! the same connection, and the HTTP work of the connections past the first few runs on the
//! `cluster-api` threads instead of queueing on Raft's one.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::Cluster;
use gateway::server::spill::NEAR;

/// Connections opened past the near ones.
const FAR: usize = 6;
/// Claims sent on each far connection, one after another.
const CLAIMS_EACH: u64 = 20;

/// One keep-alive connection to the cluster listener.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect to the cluster listener");
        stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Conn { reader: BufReader::new(stream) }
    }

    /// Claims `device` at `attempt` on this connection; answers the status and the body.
    fn claim(&mut self, addr: SocketAddr, bearer: &str, device: &str, attempt: u64) -> (u16, String) {
        let body = format!(r#"{{"conn": 1, "epoch": 0, "attempt": {attempt}}}"#);
        let head = format!(
            "POST /v1/devices/{device}/claim HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {bearer}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let stream = self.reader.get_mut();
        stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body.as_bytes())).expect("send a claim");
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("a status line");
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut length = 0;
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("a header line");
            if line.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().expect("a content length");
                }
            }
        }
        let mut body = vec![0; length];
        self.reader.read_exact(&mut body).expect("the body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

/// CPU time (ns) the threads of `pid` named `name` have run so far (`/proc/<pid>/task/*/schedstat`).
fn cpu_ns(pid: u32, name: &str) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the node's threads");
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

#[test]
fn connections_past_the_first_few_are_served_on_the_cluster_api_runtime() {
    let (c, _) = Cluster::form(1, &[]);
    let (addr, pid, bearer) = (c.nodes[0].cluster_addr(), c.nodes[0].pid().expect("a running node"), c.bearer());
    // A fresh leader may answer 503 for a moment.
    c.claim_accepted(0, "warm", 1, 0, 1, Duration::from_secs(30));
    // Every connection is answered once before the next opens, so each is accepted (and
    // placed) while all the ones before it are still open: the last FAR are past the near ones.
    let mut conns: Vec<Conn> = (0..NEAR + FAR)
        .map(|i| {
            let mut conn = Conn::open(addr);
            let (status, body) = conn.claim(addr, &bearer, &format!("near-{i}"), 1);
            assert_eq!(status, 200, "connection {i}: {body}");
            conn
        })
        .collect();

    let before = cpu_ns(pid, "cluster-api");
    for (i, conn) in conns.iter_mut().enumerate().skip(NEAR) {
        for attempt in 1..=CLAIMS_EACH {
            let (status, body) = conn.claim(addr, &bearer, &format!("far-{i}"), attempt);
            let reply: serde_json::Value = serde_json::from_str(&body).expect("a JSON reply");
            assert_eq!(
                (status, reply["result"].as_str()),
                (200, Some("accepted")),
                "connection {i}, claim {attempt}: {body}"
            );
        }
    }
    let used = cpu_ns(pid, "cluster-api") - before;
    assert!(
        used > 0,
        "{} claims on connections past the first {NEAR} ran no cluster-api thread",
        FAR as u64 * CLAIMS_EACH
    );

    // The near connections are still served after the far ones' traffic.
    for (i, conn) in conns.iter_mut().enumerate().take(NEAR) {
        let (status, body) = conn.claim(addr, &bearer, &format!("near-{i}"), 2);
        assert_eq!(status, 200, "connection {i} again: {body}");
    }
}
