//! The state apply's own cost: `cargo bench --bench apply`. No cluster and no fsync: the
//! replicated state machine's rules (`machine::apply`) over a real `state.redb`
//! (`store::state::StateDb::apply`, as every node runs it for every committed entry), on a file
//! in `/dev/shm` when there is one, holding `APPLY_BENCH_HELD` devices (default 20,000) first.
//!
//! Workloads, each at 1 command per transaction (one claim per entry: a lone client) and at
//! `APPLY_BENCH_BATCH` (default 73: what the claims bench folds per entry at 256 clients):
//! `fresh` claims of new devices, `reclaim` of held devices by another node (the route moves,
//! the per-node index entry too), `release` of held routes. The reference, side by side: one
//! bare redb insert of a 64-byte value per command, keyed by device, in transactions of the same
//! size and durability: the least any layout that writes a row per command could cost.
//!
//! Prints microseconds per command and the ratio to the reference (the median of
//! `APPLY_BENCH_ROUNDS`, default 3, alternating rounds). Wall time on a shared machine moves;
//! for instruction counts run one workload under callgrind and toggle on [`timed`]:
//! `APPLY_BENCH_ONLY=fresh:73 valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='apply::timed' target/release/deps/apply-<hash> --bench` (the reference runs
//! in `support::replica::bare_inserts`, outside the toggle).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::sync::Arc;
use std::time::Instant;

use gateway::codec::head_for_bytes;
use gateway::machine::{self, Claim, Command, ExtendLeases, Input, Member, Release, Renew, State};
use gateway::raft::network::snapshot_body;
use gateway::raft::state_machine::decode_snapshot;
use gateway::raft::types::{Snapshot, SnapshotMeta, Vote};
use gateway::store::state::StateDb;
use support::median;
use support::replica::{bare_inserts, device, dir};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A state machine over a fresh `state.redb`: nodes 1–3 members with live leases, `held`
/// devices claimed on node 1.
struct Machine {
    _dir: tempfile::TempDir,
    db: StateDb,
    state: State,
    index: u64,
}

impl Machine {
    fn new(held: usize) -> Machine {
        let dir = dir();
        let (db, _) = StateDb::open(dir.path(), 64 << 20).expect("state.redb opens");
        let mut m = Machine { _dir: dir, db, state: State::default(), index: 0 };
        let members: BTreeMap<u64, Member> = [1, 2, 3]
            .iter()
            .map(|&id| {
                (
                    id,
                    Member {
                        name: format!("n{id}").into(),
                        cluster_addr: format!("127.0.0.1:{id}").into(),
                        ..Default::default()
                    },
                )
            })
            .collect();
        m.entry(Input::Membership { members, voters: [1, 2, 3].into_iter().collect::<BTreeSet<_>>() });
        m.entry(Input::Commands { term: 2, cmds: Arc::new(vec![ExtendLeases { at_ms: 0, lease_ms: 0 }.into()]) });
        let renew =
            |node| Renew { node, at_ms: 0, lease_ms: 1 << 40, connections: 0, draining: false, incarnation: 0 }.into();
        m.entry(Input::Commands { term: 2, cmds: Arc::new(vec![renew(1), renew(2)]) });
        let all: Vec<usize> = (0..held).collect();
        for chunk in all.chunks(100) {
            m.entry(Input::Commands { term: 2, cmds: Arc::new(chunk.iter().map(|&n| claim(n, 1, 1)).collect()) });
        }
        m
    }

    fn entry(&mut self, input: Input) {
        self.index += 1;
        let (index, state) = (self.index, &mut self.state);
        self.db
            .apply(|tx| {
                let before = state.clone();
                let mut events = Vec::new();
                machine::apply(state, tx, index, input, None, &mut events)?;
                tx.save(&before, state, b"applied")
            })
            .expect("apply");
    }
}

fn claim(n: usize, attempt: u64, node: u64) -> Command {
    Claim { device: device(n), node, conn: n as u64, epoch: 0, attempt }.into()
}

/// The entries of one workload: `txns` of `per` commands each.
fn workload(kind: &str, per: usize, txns: usize, held: usize) -> Vec<Vec<Command>> {
    (0..txns)
        .map(|t| {
            (0..per)
                .map(|i| {
                    let n = t * per + i;
                    match kind {
                        "fresh" => claim(held + n, 1, 1),
                        "reclaim" => claim(n % held, 2 + (n / held) as u64, 2),
                        _ => Release { device: device(n % held), conn: (n % held) as u64 }.into(),
                    }
                })
                .collect()
        })
        .collect()
}

/// Applies `entries`; the seconds it took.
#[inline(never)]
fn timed(m: &mut Machine, entries: Vec<Vec<Command>>) -> f64 {
    let t = Instant::now();
    for cmds in entries {
        m.entry(Input::Commands { term: 2, cmds: Arc::new(cmds) });
    }
    t.elapsed().as_secs_f64()
}

/// What a snapshot costs: seconds, bytes and memory of each step.
struct SnapshotCost {
    dump_s: f64,
    save_s: f64,
    install_s: f64,
    /// Opening the installed file again, as a restarted node does (the route index and the row
    /// cache are rebuilt from the device rows).
    open_s: f64,
    /// Reading the stored snapshot back and making the RPC body of it, as a leader does to send
    /// it to a follower (`get_current_snapshot`: `StateDb::read_snapshot` and `decode_snapshot`;
    /// then `network::snapshot_body`).
    read_s: f64,
    /// The peak resident bytes over that read and the body, less the resident bytes before them.
    read_peak_bytes: u64,
    /// The resident bytes held once the body is made (while the follower takes it), less those
    /// before the read.
    send_held_bytes: u64,
    /// Saving the same snapshot again over the kept one, as every save after a node's first does,
    /// and the peak resident bytes that took above those before it.
    resave_s: f64,
    resave_peak_bytes: u64,
    bytes: usize,
    /// The process's peak resident bytes over the dump and the save, less its resident bytes
    /// before them (Linux: `VmHWM` after resetting it through `clear_refs`; 0 elsewhere).
    build_peak_bytes: u64,
}

/// A line of `/proc/self/status` in bytes (0 where there is none).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or("");
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).unwrap_or(0) * 1024
}

/// Builds a snapshot of the machine's whole state as a node does (`StateDb::dump`, then
/// `StateDb::save_snapshot` of its bytes), then installs it into a fresh `state.redb` as a
/// follower that receives it does (`StateDb::install`, which also rebuilds the route index and
/// the row cache), and opens that file again as a restarted node does.
#[inline(never)]
fn timed_snapshot(m: &Machine) -> SnapshotCost {
    // Resets the peak resident size to the current one (Linux 4.0+).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_bytes("VmRSS:");
    let t = Instant::now();
    let dump = m.db.dump().expect("dump");
    let dump_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    // Stored as a node stores it: the meta's head, then the data (`codec::encode_with_bytes`).
    let head = head_for_bytes(&SnapshotMeta::default(), dump.data.len()).expect("head");
    m.db.save_snapshot(1, &[&head, &dump.data]).expect("save_snapshot");
    let save_s = t.elapsed().as_secs_f64();
    let build_peak_bytes = status_bytes("VmHWM:").saturating_sub(before);
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_bytes("VmRSS:");
    let t = Instant::now();
    let stored = m.db.read_snapshot().expect("read_snapshot").expect("stored");
    let (meta, data) = decode_snapshot(stored).expect("decode_snapshot");
    let body = snapshot_body(&Vote::new(1, 1), Snapshot { meta, snapshot: Cursor::new(data) }).expect("body");
    let read_s = t.elapsed().as_secs_f64();
    let read_peak_bytes = status_bytes("VmHWM:").saturating_sub(before);
    let send_held_bytes = status_bytes("VmRSS:").saturating_sub(before);
    assert!(body.len() > dump.data.len());
    drop(body);
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = status_bytes("VmRSS:");
    let t = Instant::now();
    m.db.save_snapshot(2, &[&head, &dump.data]).expect("save_snapshot again");
    let resave_s = t.elapsed().as_secs_f64();
    let resave_peak_bytes = status_bytes("VmHWM:").saturating_sub(before);
    let into = dir();
    let (fresh, _) = StateDb::open(into.path(), 64 << 20).expect("state.redb opens");
    let applied = dump.applied.as_deref().unwrap_or_default();
    let t = Instant::now();
    fresh.install(&dump.data, applied, 1, &[&dump.data]).expect("install");
    let install_s = t.elapsed().as_secs_f64();
    drop(fresh);
    let t = Instant::now();
    let reopened = StateDb::open(into.path(), 64 << 20).expect("state.redb reopens");
    let open_s = t.elapsed().as_secs_f64();
    drop(reopened);
    SnapshotCost {
        dump_s,
        save_s,
        install_s,
        open_s,
        read_s,
        read_peak_bytes,
        send_held_bytes,
        resave_s,
        resave_peak_bytes,
        bytes: dump.data.len(),
        build_peak_bytes,
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let held = env("APPLY_BENCH_HELD", 20_000).max(1);
    let batch = env("APPLY_BENCH_BATCH", 73).max(1);
    let rounds = env("APPLY_BENCH_ROUNDS", 3).max(1);
    let only = std::env::var("APPLY_BENCH_ONLY").ok();
    // About 15,000 commands a run (3,000 single-command transactions), whatever the batch, and
    // never more than the devices held: each reclaim and release then finds a route of its own.
    let sizes = [(1, 3_000.min(held)), (batch, (15_000.min(held) / batch).max(1))];
    println!("state apply, {held} devices held, median of {rounds} alternating rounds");
    println!("workload | cmds/txn |  us/cmd | bare insert us/cmd | ratio");
    let mut json = Vec::new();
    for kind in ["fresh", "reclaim", "release"] {
        for (per, txns) in sizes {
            if only.as_deref().is_some_and(|o| o != format!("{kind}:{per}")) {
                continue;
            }
            let cmds = (per * txns) as f64;
            let (mut us, mut bare) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let mut m = Machine::new(held);
                us.push(timed(&mut m, workload(kind, per, txns, held)) * 1e6 / cmds);
                if only.is_none() {
                    bare.push(bare_inserts(per, txns, held) * 1e6 / cmds);
                }
            }
            let (us, bare) = (median(us), if bare.is_empty() { f64::NAN } else { median(bare) });
            let (bare_s, ratio) = if bare.is_nan() {
                ("-".into(), "-".into())
            } else {
                (format!("{bare:.2}"), format!("{:.2}x", us / bare))
            };
            println!("{kind:>8} | {per:>8} | {us:>7.2} | {bare_s:>18} | {ratio:>6}");
            json.push(serde_json::json!({"workload": kind, "cmds_per_txn": per, "us_per_cmd": us, "bare_insert_us_per_cmd": bare}));
        }
    }
    // A snapshot of the whole state (`APPLY_BENCH_ONLY=snapshot` alone): what a node spends
    // every time its log reaches the snapshot policy, in proportion to the devices it holds, and
    // what a follower that receives it spends installing it.
    let mut snapshot = serde_json::Value::Null;
    if only.as_deref().is_none_or(|o| o == "snapshot") {
        let (mut dump, mut save, mut install, mut open, mut peak, mut bytes) =
            (vec![], vec![], vec![], vec![], vec![], 0);
        let (mut read, mut read_peak, mut held_sending) = (vec![], vec![], vec![]);
        let (mut resave, mut resave_peak) = (vec![], vec![]);
        let per_device = |s: f64| s * 1e6 / held as f64;
        for _ in 0..rounds {
            let m = Machine::new(held);
            let cost = timed_snapshot(&m);
            dump.push(per_device(cost.dump_s));
            save.push(per_device(cost.save_s));
            install.push(per_device(cost.install_s));
            open.push(per_device(cost.open_s));
            peak.push(cost.build_peak_bytes as f64);
            read.push(per_device(cost.read_s));
            read_peak.push(cost.read_peak_bytes as f64);
            held_sending.push(cost.send_held_bytes as f64);
            resave.push(per_device(cost.resave_s));
            resave_peak.push(cost.resave_peak_bytes as f64);
            bytes = cost.bytes;
        }
        let (dump, save, install, open, peak) =
            (median(dump), median(save), median(install), median(open), median(peak));
        let (read, read_peak, held_sending) = (median(read), median(read_peak), median(held_sending));
        let (resave, resave_peak) = (median(resave), median(resave_peak));
        println!(
            "snapshot of {held} devices: dump {dump:.2} us a device, save {save:.2} us a device, install {install:.2} us a device, open {open:.2} us a device, {:.1} bytes a device; building it took {:.1} MB more resident memory ({:.2}x its bytes)",
            bytes as f64 / held as f64,
            peak / 1e6,
            peak / bytes as f64
        );
        println!(
            "reading it back and making the RPC body: {read:.3} us a device, {:.1} MB more resident memory at the most ({:.2}x its bytes), {:.1} MB held while it is sent ({:.2}x)",
            read_peak / 1e6,
            read_peak / bytes as f64,
            held_sending / 1e6,
            held_sending / bytes as f64
        );
        println!(
            "saving it again over the kept one: {resave:.3} us a device, {:.1} MB more resident memory at the most ({:.2}x its bytes)",
            resave_peak / 1e6,
            resave_peak / bytes as f64
        );
        snapshot = serde_json::json!({"devices": held, "dump_us_per_device": dump, "save_us_per_device": save,
            "install_us_per_device": install, "open_us_per_device": open, "bytes": bytes, "build_peak_bytes": peak,
            "read_us_per_device": read, "read_peak_bytes": read_peak,
            "send_held_bytes": held_sending, "resave_us_per_device": resave, "resave_peak_bytes": resave_peak});
    }
    println!(
        "{}",
        serde_json::json!({"bench": "apply", "held": held, "rounds": rounds, "runs": json, "snapshot": snapshot})
    );
}
