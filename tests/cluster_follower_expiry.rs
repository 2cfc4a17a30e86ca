//! kill -9 a follower: survivors expire it within lease + sweep (+ election), sweep its routes but
//! keep their floors; restarted on its data dir it comes back live under the same id, with no join.

mod common;

use std::time::Instant;

use common::{reply_node_id, wait_until, Cluster, TIMING};

#[test]
fn follower_killed_is_expired_swept_fenced_and_rejoins_on_restart() {
    let (mut c, view) = Cluster::form(3, &[]);
    let ids: Vec<u64> = (0..3).map(|i| c.node_id(i)).collect();
    let leader_id = view.leader.unwrap();
    let f = (0..3).rev().find(|&i| ids[i] != leader_id).unwrap();
    let f_name = c.nodes[f].name.clone();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != f).collect();

    // Devices owned by the follower, and control devices owned by the survivors.
    const ATTEMPT: u64 = 5;
    let on_f: Vec<String> = (0..10).map(|k| format!("e-d{k}")).collect();
    for (k, d) in on_f.iter().enumerate() {
        let v = c.claim_accepted(f, d, 500 + k as u64, 0, ATTEMPT, TIMING.settle_bound());
        assert_eq!(reply_node_id(&v), Some(ids[f]));
    }
    let mut control = Vec::new();
    for k in 0..6u64 {
        let s = survivors[(k % 2) as usize];
        let d = format!("ctl-d{k}");
        let v = c.claim_accepted(s, &d, 900 + k, 0, 1, TIMING.settle_bound());
        control.push((d, s, 900 + k, v["version"].as_u64().unwrap()));
    }
    let before = c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), "agreement before the kill", |v| {
        v.all_live() && v.member(&f_name).is_some()
    });
    wait_until(TIMING.settle_bound(), &format!("{f_name}'s route count to reach {}", on_f.len()), || {
        let s = c.try_status(survivors[0])?;
        let routes = s["members"]
            .as_array()
            .and_then(|ms| ms.iter().find(|m| m["name"] == f_name.as_str()))
            .and_then(|m| m["routes"].as_u64());
        if routes == Some(on_f.len() as u64) {
            Ok(())
        } else {
            Err(format!("routes {routes:?}"))
        }
    });

    // How often the leader has failed to open a replication stream (openraft logs each at warn).
    let l = (0..3).find(|&i| ids[i] == leader_id).unwrap();
    let leader_log = c.nodes[l].stderr_path.clone();
    let failed_dials = || {
        let log = std::fs::read_to_string(&leader_log).unwrap_or_default();
        log.lines().filter(|line| line.contains("initiate-stream-replication")).count()
    };
    let dials_before = failed_dials();
    c.kill9(f);
    let killed_at = Instant::now();
    let after = c.wait_agreement(&survivors, TIMING.expiry_bound(), &format!("survivors to expire {f_name}"), |v| {
        v.member(&f_name).is_some_and(|m| m.state == "expired")
            && !v.ring_live.contains(&f_name)
            && v.ring_version != before.ring_version
    });
    let expiry = killed_at.elapsed();
    println!(
        "expiry: {f_name} expired on every survivor after {expiry:?} (bound {:?}; lease {} ms, sweep {} ms); ring {} -> {}",
        TIMING.expiry_bound(),
        TIMING.lease_ms,
        TIMING.sweep_ms,
        before.ring_version,
        after.ring_version
    );
    assert_eq!(after.member(&f_name).unwrap().id, ids[f], "expired, not removed: still a member");
    // Redialled once per openraft backoff (200 ms), not in a tight loop (about a thousand times
    // a second, a warn line each, before the first request waited for the backoff).
    let dials = failed_dials() - dials_before;
    let bound = 2 * killed_at.elapsed().as_millis() as usize / 200 + 10;
    println!("the leader failed to dial {f_name} {dials} times in {:?} (bound {bound})", killed_at.elapsed());
    assert!((1..=bound).contains(&dials), "{dials} failed dials of the killed follower (bound {bound})");

    // Its routes are gone (the sweep that expired it deleted them in the same entry); others stay.
    for &s in &survivors {
        for d in &on_f {
            let (code, v) = c.route(s, d);
            assert_eq!(code, 404, "{d} still routed on {} after {f_name} expired: {v}", c.nodes[s].name);
            assert_eq!(v["error"], "no_route", "{v}");
        }
        for (d, owner, conn, version) in &control {
            let (code, v) = c.route(s, d);
            assert_eq!(code, 200, "control {d} lost on {}: {v}", c.nodes[s].name);
            assert_eq!(
                (reply_node_id(&v), v["conn"].as_u64(), v["version"].as_u64()),
                (Some(ids[*owner]), Some(*conn), Some(*version))
            );
        }
    }

    // A late, older handshake for a swept device is still fenced by its floor; a newer one wins.
    let s = survivors[0];
    for attempt in [ATTEMPT - 1, ATTEMPT] {
        let (code, v) = c.claim(s, &on_f[0], 7, 0, attempt);
        assert_eq!(code, 409, "attempt {attempt} after the sweep must be stale: {v}");
        assert_eq!(v["error"], "stale_attempt");
        assert_eq!((v["floor_epoch"].as_u64(), v["floor_attempt"].as_u64()), (Some(0), Some(ATTEMPT)), "{v}");
    }
    let v = c.claim_accepted(s, &on_f[0], 8, 0, ATTEMPT + 1, TIMING.settle_bound());
    assert_eq!(v["superseded"], serde_json::Value::Null, "nothing to supersede after the sweep: {v}");

    // Restart on the same data dir (same command line; --standby is ignored with existing state).
    let restarted_at = Instant::now();
    c.start(f);
    assert_eq!(c.node_id(f), ids[f], "{f_name} kept its id across the restart");
    let back = c.wait_agreement(&[0, 1, 2], TIMING.settle_bound(), &format!("{f_name} live again everywhere"), |v| {
        v.all_live() && v.voters() == 3 && v.member(&f_name).is_some_and(|m| m.id == ids[f]) && v.ring_live.len() == 3
    });
    println!(
        "{f_name} live again after restart in {:?}; ring {} -> {}",
        restarted_at.elapsed(),
        after.ring_version,
        back.ring_version
    );
    assert_ne!(back.ring_version, after.ring_version, "ring version changes when the live set changes");
}
