//! A cluster-wide admission budget (issue 12, item 1): `gateway admission set --rate R --burst B`
//! commits the budget, every live node enforces R / live (burst B / live, rounded up), the
//! survivors take over a dead node's share once the ring drops it, the cluster admits about R
//! however many nodes serve, and `admission clear` gives each node its own `--admit-rate` back.

mod common;

use std::time::{Duration, Instant};

use common::ws::{Dial, Outcome};
use common::{http, wait_until, Cluster, TIMING};
use serde_json::Value;

const RATE: f64 = 30.0;
const BURST: u32 = 9;
/// The harness's own per-node admission (a node without a budget).
const LOCAL_RATE: f64 = 1000.0;
const LOCAL_BURST: u32 = 1000;

fn admission(c: &Cluster, i: usize) -> Option<(f64, u64, Value)> {
    let s = c.get(i, "/cluster/status").ok()?.json();
    let a = &s["admission"];
    Some((a["rate_per_s"].as_f64()?, a["burst"].as_u64()?, s["admission_budget"].clone()))
}

fn wait_share(c: &Cluster, nodes: &[usize], rate: f64, burst: u64, bound: Duration) {
    for &i in nodes {
        wait_until(bound, &format!("{} to enforce {rate}/s burst {burst}", c.nodes[i].name), || {
            match admission(c, i) {
                Some((r, b, _)) if (r - rate).abs() < 1e-9 && b == burst => Ok(()),
                other => Err(other),
            }
        });
    }
}

/// Dials `count` handshakes at node `i` as fast as it can: how many were admitted (not 429), and
/// how long it took.
fn storm(c: &Cluster, i: usize, count: usize, tag: &str) -> (usize, Duration) {
    let started = Instant::now();
    let admitted = (0..count)
        .filter(|k| match c.dial(i, "/ws?attempt=1&steer=off", &Dial::token(&c.token(&format!("{tag}-{k}"), 1))) {
            Outcome::Open(_) => true,
            Outcome::Refused(r) => r.status != 429,
        })
        .count();
    (admitted, started.elapsed())
}

#[test]
fn the_cluster_admits_its_budget_however_many_nodes_serve() {
    let (mut c, _) = Cluster::form(3, &["--admit-rate", "1000", "--admit-burst", "1000"]);
    wait_share(&c, &[0, 1, 2], LOCAL_RATE, u64::from(LOCAL_BURST), TIMING.settle_bound());
    let addr = c.nodes[1].cluster_addr_str();
    let out = c.cli_auth(&["admission", "set", "--cluster", &addr, "--rate", "30", "--burst", "9"]);
    assert_eq!(out.code, Some(0), "{out:?}");
    assert!(out.stdout.contains("cluster budget set: 30/s, burst 9"), "{}", out.stdout);
    // Three live nodes: 10/s each, burst 3.
    wait_share(&c, &[0, 1, 2], RATE / 3.0, 3, TIMING.settle_bound());
    let (_, _, budget) = admission(&c, 0).unwrap();
    assert_eq!((budget["rate_per_s"].as_f64(), budget["burst"].as_u64()), (Some(RATE), Some(u64::from(BURST))));
    let show = c.cli_auth(&["admission", "show", "--cluster", &addr]);
    assert!(show.stdout.contains("cluster budget: 30/s, burst 9"), "{}", show.stdout);

    // n3 dies: once the ring drops it, n1 and n2 take 15/s each, burst 5.
    c.kill9(2);
    wait_share(&c, &[0, 1], RATE / 2.0, 5, TIMING.expiry_bound());

    // The cluster admits about the budget: each survivor at most its burst + share × T (+1 for a
    // token refilled between the two readings of the clock).
    let mut total = 0;
    let mut longest = Duration::ZERO;
    for i in [0, 1] {
        let (admitted, took) = storm(&c, i, 40, &format!("n{i}"));
        let limit = 5.0 + RATE / 2.0 * took.as_secs_f64() + 1.0;
        println!("admission budget: n{} admitted {admitted} of 40 in {took:?} (limit {limit:.1})", i + 1);
        assert!(admitted as f64 <= limit, "n{} admitted {admitted}, limit {limit:.1}", i + 1);
        assert!(admitted >= 5, "n{} admitted only {admitted}: its burst is 5", i + 1);
        total += admitted;
        longest = longest.max(took);
    }
    assert!(
        total as f64 <= f64::from(BURST) + 1.0 + RATE * longest.as_secs_f64() + 2.0,
        "the cluster admitted {total}"
    );

    let out = c.cli_auth(&["admission", "clear", "--cluster", &addr]);
    assert_eq!(out.code, Some(0), "{out:?}");
    wait_share(&c, &[0, 1], LOCAL_RATE, u64::from(LOCAL_BURST), TIMING.settle_bound());
    let (_, _, budget) = admission(&c, 1).unwrap();
    assert!(budget.is_null(), "{budget}");
}

#[test]
fn bad_budgets_are_refused() {
    let (c, _) = Cluster::form(1, &[]);
    let addr = c.nodes[0].cluster_addr_str();
    for (rate, burst) in [("0", "5"), ("NaN", "5"), ("2e9", "5"), ("10", "0")] {
        let out = c.cli_auth(&["admission", "set", "--cluster", &addr, "--rate", rate, "--burst", burst]);
        assert_ne!(out.code, Some(0), "rate {rate} burst {burst} accepted: {out:?}");
        assert!(out.stderr.contains("bad_admission") || out.stderr.contains("invalid value"), "{}", out.stderr);
    }
    let r = c.get(0, "/cluster/status").unwrap().json();
    assert!(r["admission_budget"].is_null(), "{r}");
}

/// The budget can come from the configuration (`cluster_admit_rate`/`_burst`, here as flags):
/// the bootstrapping node commits it once the cluster forms; a node that joins later shares it.
#[test]
fn a_configured_budget_is_committed_at_bootstrap() {
    let budget = ["--cluster-admit-rate", "30", "--cluster-admit-burst", "9"];
    let (c, _) = Cluster::form(2, &budget);
    wait_share(&c, &[0, 1], RATE / 2.0, u64::from(BURST).div_ceil(2), TIMING.settle_bound());
    let (_, _, committed) = admission(&c, 1).expect("status");
    assert_eq!(committed["rate_per_s"].as_f64(), Some(RATE), "{committed}");
    assert_eq!(committed["burst"].as_u64(), Some(u64::from(BURST)), "{committed}");
    // The share is exported for dashboards and autoscalers.
    wait_until(TIMING.settle_bound(), "the share in /metrics", || {
        match (c.metric(1, "gateway_admission_rate_per_s"), c.metric(1, "gateway_admission_burst")) {
            (Some(r), Some(b)) if (r - RATE / 2.0).abs() < 1e-9 && b == 5.0 => Ok(()),
            other => Err(other),
        }
    });
}

/// A member's death reaches the survivors through its devices (`?fallback=<it>`) before the ring
/// can drop it. A survivor that then finds the member's cluster port refusing connections takes
/// its share of the budget at once (turns told to a storm's refused devices are paced at the
/// share in force), and gives it back once the member's process answers again. Two nodes, so the
/// ring cannot drop n2 here (no quorum without it): only that evidence can move n1's share.
#[test]
fn a_survivor_takes_a_dead_members_share_while_its_port_refuses() {
    let budget = ["--cluster-admit-rate", "30", "--cluster-admit-burst", "9"];
    let (mut c, _) = Cluster::form(2, &budget);
    wait_share(&c, &[0], RATE / 2.0, 5, TIMING.settle_bound());
    c.kill9(1);
    // What a device that lost n2 sends n1 (this one without a token: 401, but the name is heard).
    let report =
        || http::request(c.public_addr(0), "GET", "/v1/placement?fallback=n2", &[], None, http::REQUEST_TIMEOUT);
    wait_until(TIMING.settle_bound(), "n1 to take n2's share", || {
        let _ = report();
        match (admission(&c, 0), c.metric(0, "gateway_admission_gone_members")) {
            (Some((r, b, _)), Some(gone)) if (r - RATE).abs() < 1e-9 && b == u64::from(BURST) && gone == 1.0 => Ok(()),
            other => Err(other),
        }
    });
    let status = c.get(0, "/cluster/status").unwrap().json();
    let mut ring: Vec<&str> = status["ring"]["live"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    ring.sort_unstable();
    assert_eq!(ring, ["n1", "n2"], "the ring still counts n2: {status}");
    assert_eq!(c.metric(0, "gateway_admission_rate_per_s"), Some(RATE));

    // n2's process is back: n1's next probe answers and the share goes back to half.
    c.start(1);
    wait_until(TIMING.settle_bound(), "n1 to give n2's share back", || {
        match (admission(&c, 0), c.metric(0, "gateway_admission_gone_members")) {
            (Some((r, b, _)), Some(gone)) if (r - RATE / 2.0).abs() < 1e-9 && b == 5 && gone == 0.0 => Ok(()),
            other => Err(other),
        }
    });
}
