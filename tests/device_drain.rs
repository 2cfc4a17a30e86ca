//! V6, SIGTERM drain: every device sees `goaway` then close 1001, the ring drops the node on every
//! member at once, the process exits 0 owning no routes, and every device connects elsewhere.

mod common;

use std::time::{Duration, Instant};

use common::ws::{Dial, Outcome};
use common::{wait_until, Cluster, SLACK, TIMING};

const DEVICES: usize = 6;

#[test]
fn sigterm_moves_every_device_elsewhere_and_exits_clean() {
    let (mut c, _) = Cluster::form(3, &[]);
    let n1 = 0;
    let mut devices = Vec::new();
    for k in 0..DEVICES {
        let device = format!("dr{k}");
        let token = c.token(&device, 0);
        let mut ws = c.dial(n1, "/ws?attempt=1&steer=off", &Dial::token(&token)).open(&device);
        assert_eq!(ws.hello()["node"], "n1");
        devices.push((device, token, ws));
    }

    c.sigterm(n1);
    let started = Instant::now();
    // Each device: goaway first, then 1001 (default drain_rate 500/s: all within the slack).
    for (device, _, ws) in devices.iter_mut() {
        let goaway = ws.next_text(SLACK, &format!("{device} goaway"));
        assert_eq!((goaway["t"].as_str(), goaway["reason"].as_str()), (Some("goaway"), Some("drain")), "{goaway}");
        let (_, code, _) = ws.expect_close(SLACK, &format!("{device} close after goaway"));
        assert_eq!(code, 1001, "{device}: drain closes with 1001");
    }
    println!("[device_drain] {DEVICES} devices told goaway + 1001 within {:?}", started.elapsed());
    let status = c.wait_exit(n1, TIMING.settle_bound());
    assert!(status.success(), "a drained node exits 0: {status}");
    println!("[device_drain] n1 exited {status} {:?} after SIGTERM", started.elapsed());

    // The survivors dropped n1 from the ring (Drain, not a lease lapse) and no route names it.
    let survivors = [1, 2];
    c.wait_agreement(&survivors, TIMING.failover_bound(), "n1 out of the ring on every survivor", |v| {
        !v.ring_live.iter().any(|n| n == "n1") && v.ring_live.len() == 2
    });
    // ReleaseNode committed on n1 just before it exited; a survivor applies it once it learns the
    // commit (from the next leader's first entry, if n1 led), not necessarily by now.
    for (device, _, _) in &devices {
        wait_until(TIMING.failover_bound(), &format!("{device} unrouted after the drain"), || {
            match c.route(1, device) {
                (404, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        });
    }

    // Every device reconnects the way a client does: follow 307, retry 503 after Retry-After
    // (with a newer attempt each time), until a survivor accepts it.
    let mut reconnected = Vec::new();
    for (device, token, _) in &devices {
        let mut attempt = 1;
        let mut node = 1;
        let mut ws = wait_until(TIMING.settle_bound(), &format!("{device} to reconnect to a survivor"), || {
            attempt += 1;
            match c.dial(node, &format!("/ws?attempt={attempt}"), &Dial::token(token)) {
                Outcome::Open(ws) => Ok(ws),
                Outcome::Refused(r) if r.status == 307 => {
                    node = if r.header("location").is_some_and(|l| l.starts_with(&c.public_url(2))) { 2 } else { 1 };
                    Err(format!("redirected to node {node}"))
                }
                Outcome::Refused(r) => {
                    std::thread::sleep(Duration::from_secs(r.retry_after().unwrap_or(1))); // Retry-After is the protocol
                    Err(format!("{} {}", r.status, r.error()))
                }
            }
        });
        let hello = ws.hello();
        assert_ne!(hello["node"], "n1", "{device} placed on the drained node: {hello}");
        reconnected.push(ws); // kept open: a closed connection releases its route
    }
    wait_until(SLACK, "the survivors to hold every device's route", || {
        let routed = devices.iter().filter(|(d, _, _)| c.route(1, d).0 == 200).count();
        if routed == DEVICES {
            Ok(())
        } else {
            Err(routed)
        }
    });
}
