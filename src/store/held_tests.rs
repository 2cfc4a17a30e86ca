//! A held apply transaction: route lookups answer its rows, and everything that reads or writes
//! past it (another table's write, a dump, a snapshot's save, the close, its age) commits it.

use std::time::{Duration, Instant};

use redb::ReadableDatabase;

use super::HOLD_ROWS;
use crate::machine;
use crate::machine::testkit::{self, Sm};
use crate::store::schema::DEVICES;
use crate::store::state::StateDb;
use crate::store::tests::RedbBackend;

/// Longer than any test here runs: only what the test does commits.
const FOREVER: Duration = Duration::from_secs(3600);

/// Whether `device` has a row in the table as committed (what a read transaction sees).
fn committed(db: &StateDb, device: &str) -> bool {
    let txn = db.db.begin_read().unwrap();
    txn.open_table(DEVICES).unwrap().get(device).unwrap().is_some()
}

fn held(db: &StateDb) -> bool {
    db.hold.lock().is_some()
}

/// A state machine that holds for an hour, with `d1` claimed on node 1 and held.
fn d1_held() -> (Sm<RedbBackend>, StateDb) {
    let mut sm = Sm::new_on(RedbBackend::holding(FOREVER));
    let db = sm.b.db().clone();
    assert!(held(&db), "the membership and lease applies stay open");
    // A node's first renewal records a cluster event: the events API reads them.
    sm.one(testkit::renew(1, 0, 1 << 40));
    assert!(!held(&db), "an apply that writes a cluster event commits");
    sm.one(testkit::claim("d1", 1, 7, 0, 1));
    assert!(held(&db) && !committed(&db, "d1"), "a claim's apply stays open");
    (sm, db)
}

#[test]
fn a_held_claim_answers_route_lookups_and_commits_with_the_next_publish() {
    let (mut sm, db) = d1_held();
    let read = db.route("d1").unwrap();
    assert_eq!(read.0.as_ref().map(|r| (r.node, r.conn)), Some((1, 7)), "route lookups read the held rows");
    assert!(read.1.is_some());
    assert_eq!(db.routes(&["d1".to_string(), "nobody".to_string()]).unwrap(), vec![read.clone(), (None, None)]);
    assert_eq!(db.cached_route("d1"), Some(read));

    // A publish writes the stream tables, which device sessions read right after the apply.
    sm.entry(vec![testkit::publish("d1", "{}", None, 0, 100, u64::MAX)]);
    assert!(!held(&db) && committed(&db, "d1"), "an apply that writes a stream commits");
    assert_eq!(db.stream("d1", 0, 10).unwrap().messages.len(), 1);

    // A reconnecting device's claim (it has a floor) is held too, and read back as held.
    sm.one(testkit::renew(2, 0, 1 << 40));
    sm.one(testkit::claim("d1", 2, 9, 0, 2));
    assert!(held(&db));
    assert_eq!(db.route("d1").unwrap().0.map(|r| (r.node, r.conn)), Some((2, 9)));

    // A tenant's row is read by the tenant API.
    let policy = machine::SetTenantPolicy { tenant: "t".into(), max_connections: Some(9), publishes: None, at_ms: 0 };
    sm.one(policy.into());
    assert!(!held(&db), "an apply that writes a tenant commits");
}

#[test]
fn a_dump_a_snapshot_save_and_the_close_commit_what_is_held() {
    let (mut sm, db) = d1_held();
    db.dump().unwrap();
    assert!(!held(&db) && committed(&db, "d1"), "a dump reads every apply");

    sm.one(testkit::claim("d2", 1, 8, 0, 1));
    assert!(held(&db));
    db.save_snapshot(1, &[b"snapshot"]).unwrap();
    assert!(!held(&db) && committed(&db, "d2"), "a snapshot's durable commit takes the held applies");

    sm.one(testkit::claim("d3", 1, 9, 0, 1));
    assert!(held(&db));
    drop(db);
    let (b, _) = crate::machine::testkit::Backend::reopen(sm.b);
    assert_eq!(b.db().route("d3").unwrap().0.map(|r| r.conn), Some(9), "closing commits the held applies");
}

#[test]
fn a_held_transaction_commits_when_it_is_old_or_large_enough() {
    // Long enough that the claim's own apply never outlasts it (it would commit inline).
    let hold = Duration::from_secs(2);
    let mut sm = Sm::new_on(RedbBackend::holding(hold));
    sm.one(testkit::renew(1, 0, 1 << 40));
    sm.one(testkit::claim("d1", 1, 7, 0, 1));
    let db = sm.b.db().clone();
    assert!(held(&db) && !committed(&db, "d1"));
    // The committing thread checks once per hold: committed within two, given slack for a
    // loaded machine.
    let deadline = Instant::now() + hold * 2 + Duration::from_secs(10);
    while !committed(&db, "d1") {
        assert!(Instant::now() < deadline, "an idle held transaction was not committed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!held(&db));

    let mut sm = Sm::new_on(RedbBackend::holding(FOREVER));
    sm.one(testkit::renew(1, 0, 1 << 40));
    let db = sm.b.db().clone();
    let per_entry = HOLD_ROWS / 4;
    for e in 0..4 {
        let claims = (0..per_entry).map(|i| testkit::claim(&format!("e{e}-{i}"), 1, i as u64, 0, 1)).collect();
        sm.entry(claims);
        assert_eq!(held(&db), e < 3, "{} rows changed", (e + 1) * per_entry);
    }
    assert!(committed(&db, "e0-0") && committed(&db, "e3-0"));
}
