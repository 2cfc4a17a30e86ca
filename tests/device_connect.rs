//! A device connects through the public listener: `hello` names the node, the route and `status`
//! show it, closing releases the route but keeps the floor, and the floor fences a replayed attempt
//! while a newer attempt (or a newer install epoch) is accepted.

mod common;

use std::time::{Duration, Instant};

use common::ws::Dial;
use common::{wait_until, Cluster, SLACK, TIMING};

#[test]
fn device_connects_is_routed_released_and_fenced() {
    let (c, _) = Cluster::form(1, &[]);
    let me = c.node_id(0);
    let token = c.token("d1", 0);

    let t0 = Instant::now();
    let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).open("d1 attempt 1");
    let hello = ws.hello();
    println!("[device_connect] hello after {:?}: {hello}", t0.elapsed());
    assert_eq!(hello["device"], "d1", "{hello}");
    assert_eq!(hello["node"], "n1", "{hello}");
    assert_eq!(hello["node_id"].as_u64(), Some(me), "{hello}");
    assert_eq!(hello["route_version"].as_u64(), Some(1), "{hello}");
    let conn = hello["conn"].as_u64().unwrap_or_else(|| panic!("hello.conn is a number: {hello}"));

    let (st, route) = c.route(0, "d1");
    assert_eq!(st, 200, "route of a connected device: {route}");
    assert_eq!(route["node"]["name"], "n1", "{route}");
    assert_eq!(route["conn"].as_u64(), Some(conn), "route names the connection from hello: {route}");
    assert_eq!(route["version"].as_u64(), Some(1), "{route}");

    // Connection counts travel with lease renewals (every lease/5).
    let bound = Duration::from_millis(TIMING.lease_ms) + SLACK;
    let t = Instant::now();
    wait_until(bound, "status to show n1 holding a connection", || {
        let s = c.try_status(0)?;
        let m = s["members"].as_array().and_then(|ms| ms.iter().find(|m| m["name"] == "n1")).cloned();
        match m {
            Some(m) if m["connections"].as_u64().unwrap_or(0) >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    println!("[device_connect] status showed the connection after {:?} (bound {bound:?})", t.elapsed());
    assert_eq!(c.metric(0, "gateway_connections"), Some(1.0), "connections gauge with one device");

    // The device closes: its route is released, its floor stays.
    assert_eq!(ws.close(1000), Ok(1000), "close echo");
    let t = Instant::now();
    let released = wait_until(SLACK, "route released after the device closed", || match c.try_route(0, "d1") {
        Ok((404, v)) => Ok(v),
        other => Err(format!("{other:?}")),
    });
    println!("[device_connect] route released {:?} after the close echo", t.elapsed());
    assert_eq!(released["error"], "no_route", "{released}");
    let floor = &released["floor"];
    assert_eq!(floor["attempt"].as_u64(), Some(1), "floor kept after release: {released}");
    assert_eq!(floor["epoch"].as_u64(), Some(0), "{released}");
    assert_eq!(floor["last_node"]["name"], "n1", "{released}");
    wait_until(SLACK, "connections gauge back to 0", || match c.metric(0, "gateway_connections") {
        Some(0.0) => Ok(()),
        other => Err(other),
    });

    // A replayed handshake with the same attempt is stale.
    let r = c.dial(0, "/ws?attempt=1", &Dial::token(&token)).refused("replayed attempt 1");
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.error(), "stale_attempt", "{r:?}");
    assert_eq!((r.body["floor_epoch"].as_u64(), r.body["floor_attempt"].as_u64()), (Some(0), Some(1)), "{r:?}");

    // The next attempt is accepted with the next route version.
    let mut ws2 = c.dial(0, "/ws?attempt=2", &Dial::token(&token)).open("d1 attempt 2");
    let hello2 = ws2.hello();
    assert_eq!(hello2["route_version"].as_u64(), Some(2), "{hello2}");
    assert_ne!(hello2["conn"].as_u64(), Some(conn), "a new connection id: {hello2}");
    let (st, route) = c.route(0, "d1");
    assert_eq!((st, route["conn"].as_u64(), route["version"].as_u64()), (200, hello2["conn"].as_u64(), Some(2)));

    // A reinstall (epoch 1) is newer than any attempt of epoch 0, even attempt 0; it takes over.
    let token_e1 = c.token("d1", 1);
    let mut ws3 = c.dial(0, "/ws?attempt=0", &Dial::token(&token_e1)).open("d1 epoch 1 attempt 0");
    let hello3 = ws3.hello();
    assert_eq!(hello3["route_version"].as_u64(), Some(3), "{hello3}");
    let (_, code, reason) = ws2.expect_close(SLACK, "attempt 2 superseded by the epoch-1 claim");
    assert_eq!(code, 4001, "superseded close code (reason {reason:?})");
    // ...and an old install's higher attempt is now stale, named by the epoch-1 floor.
    let r = c.dial(0, "/ws?attempt=99", &Dial::token(&token)).refused("epoch 0 attempt 99 after epoch 1");
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!((r.body["floor_epoch"].as_u64(), r.body["floor_attempt"].as_u64()), (Some(1), Some(0)), "{r:?}");

    // Browsers pass the token in the query; a device that just drops its TCP connection (no close
    // frame) is released too.
    let token2 = c.token("d2", 0);
    let mut q = c.dial(0, &format!("/ws?attempt=1&token={token2}"), &Dial::anonymous()).open("d2 with ?token=");
    assert_eq!(q.hello()["device"], "d2");
    drop(q);
    let t = Instant::now();
    wait_until(SLACK, "d2's route released after its TCP connection dropped", || match c.try_route(0, "d2") {
        Ok((404, v)) if v["floor"]["attempt"] == 1 => Ok(()),
        other => Err(format!("{other:?}")),
    });
    println!("[device_connect] dropped connection released after {:?}", t.elapsed());

    let accepted = c.metric_labeled(0, "gateway_handshakes_total", r#"result="accepted""#);
    let stale = c.metric_labeled(0, "gateway_handshakes_total", r#"result="stale_attempt""#);
    assert_eq!((accepted, stale), (Some(4.0), Some(2.0)), "handshakes counted by result");
    drop(ws3);
}

/// Operators size nodes by `gateway_process_*`: the figures are this process's own (resident
/// memory as the kernel counts it, one descriptor per held connection).
#[test]
fn process_metrics_follow_the_process() {
    let (c, _) = Cluster::form(1, &[]);
    let pid = c.nodes[0].pid().expect("pid");
    let fds = |c: &Cluster| c.metric(0, "gateway_process_open_fds").expect("gateway_process_open_fds");
    let before = fds(&c);
    const HELD: usize = 20;
    let held: Vec<_> = (0..HELD)
        .map(|i| {
            let device = format!("pm-{i}");
            let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token(&device, 0))).open(&device);
            ws.hello();
            ws
        })
        .collect();
    let during = fds(&c);
    assert!(during >= before + HELD as f64, "{HELD} connections held: open fds {before} -> {during}");
    let rss = common::raw::rss_bytes(pid) as f64;
    let exported = c.metric(0, "gateway_process_resident_memory_bytes").expect("resident memory");
    // Read a moment apart, so not equal; a wrong unit (pages, KiB) would be off by 4096x or 1024x.
    assert!(exported > rss / 2.0 && exported < rss * 2.0, "exported RSS {exported}, /proc says {rss}");
    assert!(c.metric(0, "gateway_process_cpu_seconds_total").is_some_and(|s| s > 0.0), "cpu seconds");
    let waits = c.metric(0, "gateway_process_voluntary_context_switches_total");
    assert!(waits.is_some_and(|n| n > 0.0), "voluntary context switches: {waits:?}");
    assert!(c.metric(0, "gateway_process_max_fds").is_some_and(|m| m >= during), "max fds");
    // The data directory's filesystem, against df(1): the same size to the byte (a unit mistake
    // is off by 512x or 4096x); the room left between none and all of it.
    let dir = c.nodes[0].data_dir.display().to_string();
    let df = std::process::Command::new("df").args(["-B1", "--output=size", &dir]).output().expect("df");
    let size: f64 =
        String::from_utf8_lossy(&df.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).expect("df size");
    assert_eq!(c.metric(0, "gateway_data_dir_size_bytes"), Some(size), "the data dir's filesystem size, as df says");
    let room = c.metric(0, "gateway_data_dir_available_bytes");
    assert!(room.is_some_and(|r| r > 0.0 && r <= size), "room on the data dir: {room:?} of {size}");
    drop(held);
}

/// The device side's threads run at a lower priority (`--device-nice`) than the cluster side's
/// (Raft's core and replication, the log writer, renewals), also the threads either side starts
/// later: on saturated cores a disconnect wave or a storm of handshakes waits, not the lease.
#[test]
fn device_threads_yield_to_the_cluster_side() {
    let (c, _) = Cluster::form(1, &["--device-nice", "7"]);
    let pid = c.nodes[0].pid().expect("pid");
    // Traffic on both sides: a handshake claims through Raft (the apply runs on the cluster side's
    // blocking pool) and reads the device's stream (the device side's).
    let mut held = Vec::new();
    for i in 0..4 {
        let device = format!("nice-{i}");
        let mut ws = c.dial(0, "/ws?attempt=1", &Dial::token(&c.token(&device, 0))).open(&device);
        ws.hello();
        held.push(ws);
    }
    // Thread name -> nice values, from /proc (field 19 of a task's stat, after the name).
    let threads = || -> Vec<(String, i32)> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("tasks")
            .filter_map(|t| {
                let dir = t.ok()?.path();
                let comm = std::fs::read_to_string(dir.join("comm")).ok()?.trim().to_string();
                let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
                Some((comm, stat.rsplit_once(')')?.1.split_whitespace().nth(16)?.parse().ok()?))
            })
            .collect()
    };
    let all = threads();
    let main = all.iter().find(|(n, _)| n == "gateway").map(|(_, v)| *v).expect("the main thread");
    let of = |name: &str| all.iter().filter(|(n, _)| n == name).map(|(_, v)| *v).collect::<Vec<_>>();
    let (device, cluster, log) = (of("device"), of("cluster"), of("raft-log"));
    println!("[device_connect] nice: main {main}, device {device:?}, cluster {cluster:?}, raft-log {log:?}");
    assert!(device.len() >= 2, "the device runtime's threads are named `device`: {all:?}");
    assert!(cluster.len() >= 2 && log.len() == 1, "cluster workers and the log writer: {all:?}");
    assert!(device.iter().all(|v| *v == (main + 7).min(19)), "device threads at nice +7: {all:?}");
    assert!(cluster.iter().chain(&log).all(|v| *v == main), "the cluster side at the process's priority: {all:?}");
    drop(held);
}
