//! What a replica of any gateway of this design pays for each replicated command with none of
//! the gateway's own work: a bare redb row write (the apply bench's reference) and a log flush's
//! CPU. The handshakes bench adds them to the bare server's CPU for the least three replicas can
//! cost a handshake on this machine.

use std::time::Instant;

use redb::{Database, Durability, TableDefinition};

const BARE: TableDefinition<&str, &[u8]> = TableDefinition::new("bare");

/// A device id spread over the key space like independent devices (not in insert order).
pub fn device(n: usize) -> String {
    format!("bench-{}-{}", n % 256, (n as u64).wrapping_mul(2_654_435_761) % 1_000_003)
}

/// A temp dir in `/dev/shm` when there is one (no disk in the figure), else the system's.
pub fn dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.expect("a temp dir")
}

/// `txns` transactions of `per` bare inserts of a 64-byte value under fresh keys, non-durable as
/// the state apply commits, after `held` rows written first; the seconds the `txns` took. The
/// least any layout that writes a row per command could cost.
#[inline(never)]
pub fn bare_inserts(per: usize, txns: usize, held: usize) -> f64 {
    let dir = dir();
    let db = Database::builder().set_cache_size(64 << 20).create(dir.path().join("bare.redb")).expect("bare.redb");
    let value = [7u8; 64];
    let insert = |from: usize, count: usize| {
        let mut txn = db.begin_write().expect("begin");
        txn.set_durability(Durability::None).expect("durability");
        {
            let mut t = txn.open_table(BARE).expect("table");
            for n in from..from + count {
                t.insert(device(n).as_str(), value.as_slice()).expect("insert");
            }
        }
        txn.commit().expect("commit");
    };
    for from in (0..held).step_by(100) {
        insert(from, 100.min(held - from));
    }
    let t = Instant::now();
    for i in 0..txns {
        insert(held + i * per, per);
    }
    t.elapsed().as_secs_f64()
}

/// The median of `rounds` of [`bare_inserts`] of `txns` transactions of `per`: microseconds a row.
pub fn row_us(per: usize, txns: usize, held: usize, rounds: usize) -> f64 {
    let per = per.max(1);
    super::median((0..rounds).map(|_| bare_inserts(per, txns, held) * 1e6 / (per * txns) as f64).collect())
}

/// This thread's CPU time so far, in microseconds (user and system).
pub fn thread_cpu_us() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
}
