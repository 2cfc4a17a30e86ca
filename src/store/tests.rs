//! The store's tests: every rule test of the domain runs again on redb (with real reopens and
//! snapshot installs), and the table registry is checked against what the database holds.

use std::collections::{BTreeMap, BTreeSet};

use redb::{ReadableDatabase, ReadableTable, TableHandle};
use tempfile::TempDir;

use super::schema::{
    Rows, CLUSTER_EVENTS, DEVICES, DEVICE_TENANTS, HEADS, IDEMPOTENCY, KEY_ORDER, LEDGER, LEGACY_FLOORS, LEGACY_ROUTES,
    META, NODES, NODE_ROUTES, SNAPSHOT, SNAPSHOT_CHUNKS, STATE_TABLES, STREAMS, TENANTS,
};
use super::state::{DeviceRow, Loaded, StateDb};
use crate::codec::{decode, encode};
use crate::machine::tables::mem::MemTables;
use crate::machine::testkit::{self, Backend, Sm};
use crate::machine::{self, Event, Floor, Input, Member, NodeId, NodeLease, Reply, Route, State, StreamRead};

/// `state.redb` in a temp dir (on tmpfs when there is one: fsyncs on create, close and snapshot
/// dominate the runtime otherwise).
pub struct RedbBackend {
    dir: TempDir,
    db: StateDb,
}

type Applied = (u64, BTreeMap<NodeId, Member>, BTreeSet<NodeId>);

/// The state as the Raft adapter restores it: the store's part plus the membership, which the
/// applied meta carries (here: encoded by [`RedbBackend::apply`]).
fn restore(loaded: Loaded) -> State {
    let mut state = loaded.state;
    if let Some(bytes) = loaded.applied {
        let (_, members, voters): Applied = decode(&bytes).unwrap();
        (state.members, state.voters) = (members, voters);
    }
    state
}

impl RedbBackend {
    /// A fresh database whose applies stay open for at most `hold_for` (`store::held`).
    pub fn holding(hold_for: std::time::Duration) -> Self {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
        let (db, loaded) = StateDb::open_holding(dir.path(), crate::store::TEST_CACHE_BYTES, hold_for).unwrap();
        assert_eq!(loaded, Loaded::default());
        RedbBackend { dir, db }
    }

    pub fn db(&self) -> &StateDb {
        &self.db
    }
}

impl Backend for RedbBackend {
    fn fresh() -> Self {
        RedbBackend::holding(super::held::configured())
    }

    fn apply(
        &mut self,
        state: &mut State,
        index: u64,
        input: Input,
        local: Option<NodeId>,
        events: &mut Vec<Event>,
    ) -> Vec<Reply> {
        self.db
            .apply(|tx| {
                let before = state.clone();
                let replies = machine::apply(state, tx, index, input, local, events)?;
                tx.save(&before, state, &encode(&(index, &state.members, &state.voters))?)?;
                Ok(replies)
            })
            .unwrap()
    }

    fn route(&self, device: &str) -> (Option<Route>, Option<Floor>) {
        let read = self.db.route(device).unwrap();
        if let Some(cached) = self.db.cached_route(device) {
            assert_eq!(cached, read, "the row cache disagrees with the table on {device}");
        }
        read
    }

    fn stream(&self, device: &str, after: u64, limit: usize) -> StreamRead {
        self.db.stream(device, after, limit).unwrap()
    }

    fn dump(&self) -> MemTables {
        // As `StateDb::dump` does: the held applies first.
        drop(self.db.commit_held().unwrap());
        let txn = self.db.db.begin_read().unwrap();
        let mut t = MemTables::default();
        for row in txn.open_table(DEVICES).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let DeviceRow { route, floor } = decode(v.value()).unwrap();
            assert!(route.is_some() || floor.is_some(), "an empty device row is left behind");
            if let Some(r) = route {
                t.routes.insert(k.value().to_string(), r);
            }
            if let Some(f) = floor {
                t.floors.insert(k.value().to_string(), f);
            }
        }
        // Every row the row cache holds is the table's (a row it has none of: both None).
        let devices = txn.open_table(DEVICES).unwrap();
        for (device, cached) in self.db.rows.iter() {
            let row: Option<DeviceRow> = super::state::get(&devices, &*device).unwrap();
            assert_eq!(cached, row.unwrap_or_default().split(), "the row cache disagrees with the table on {device}");
        }
        // The route index lives in memory (`store::index`), as of the last apply.
        t.node_routes = self.db.index.lock().unwrap().pairs().map(|(n, d)| (n, d.to_string())).collect();
        for row in txn.open_table(HEADS).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            t.heads.insert(k.value().to_string(), decode(v.value()).unwrap());
        }
        for row in txn.open_table(STREAMS).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let (device, seq) = k.value();
            t.messages.insert((device.to_string(), seq), decode(v.value()).unwrap());
        }
        for row in txn.open_table(IDEMPOTENCY).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let (device, key) = k.value();
            t.idempotency.insert((device.to_string(), key.to_string()), decode(v.value()).unwrap());
        }
        for row in txn.open_table(KEY_ORDER).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let (device, at_ms, seq) = k.value();
            t.key_order.insert((device.to_string(), at_ms, seq), v.value().to_string());
        }
        for row in txn.open_table(DEVICE_TENANTS).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            t.device_tenants.insert(k.value().to_string(), v.value().to_string());
        }
        for row in txn.open_table(TENANTS).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            t.tenants.insert(k.value().to_string(), decode(v.value()).unwrap());
        }
        for row in txn.open_table(CLUSTER_EVENTS).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            t.cluster_events.insert(k.value(), decode(v.value()).unwrap());
        }
        for row in txn.open_table(LEDGER).unwrap().iter().unwrap() {
            let (k, v) = row.unwrap();
            let (tenant, period, id) = k.value();
            t.ledger.insert((tenant.to_string(), period, id.to_string()), decode(v.value()).unwrap());
        }
        t
    }

    fn reopen(self) -> (Self, State) {
        let RedbBackend { dir, db } = self;
        drop(db);
        let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
        (RedbBackend { dir, db }, restore(loaded))
    }

    fn install(&mut self, from: &Self) -> State {
        let dump = from.db.dump().unwrap();
        let applied = dump.applied.expect("something was applied");
        let (index, ..): Applied = decode(&applied).unwrap();
        restore(self.db.install(&dump.data, &applied, index, &[b"snapshot"]).unwrap())
    }
}

mod on_redb {
    crate::machine::testkit::backend_tests!(super::RedbBackend);
}

/// A state machine whose every table holds rows.
fn populated() -> Sm<RedbBackend> {
    let mut sm = Sm::<RedbBackend>::new();
    sm.entry(vec![
        machine::Init { cluster_id: "c".into() }.into(),
        testkit::renew(1, 0, 1 << 40),
        testkit::claim("d1", 1, 7, 0, 1),
        testkit::publish("d1", "{}", Some("key"), 0, 100, u64::MAX),
        machine::SetTenantPolicy {
            tenant: "t".into(),
            max_connections: Some(9),
            publishes: Some(machine::PublishQuota { limit: 9, period_ms: 1000 }),
            at_ms: 0,
        }
        .into(),
        machine::ClaimTenant {
            claim: machine::Claim { device: "d2".into(), node: 1, conn: 8, epoch: 0, attempt: 1 },
            tenant: "t".into(),
        }
        .into(),
    ]);
    sm
}

/// A snapshot's data as bincode's serde encoding sees it: what every build since layout 2 sends
/// and reads, and the reference `store::snapshot` writes byte for byte.
#[derive(serde::Deserialize, serde::Serialize)]
struct Body {
    tables: Vec<(String, Rows)>,
}

/// Every registered table's rows as committed, after committing what is held (as a dump does).
fn rows(db: &StateDb) -> BTreeMap<String, Rows> {
    drop(db.commit_held().unwrap());
    let txn = db.db.begin_read().unwrap();
    let copy = |t: &dyn crate::store::schema::RawTable| {
        let mut rows = Rows::new();
        t.each_row(&txn, &mut |k, v| {
            rows.push((k.to_vec(), v.to_vec()));
            Ok(())
        })
        .unwrap();
        rows
    };
    STATE_TABLES.iter().map(|&t| (t.name().to_string(), copy(t))).collect()
}

/// The registry is the whole state: every table the database holds (but the stored snapshot)
/// is registered, and a snapshot round trip carries every registered table row for row. A table
/// opened by the apply code but left out of `STATE_TABLES` fails here instead of vanishing on
/// the first snapshot install.
#[test]
fn every_table_is_registered_and_survives_a_snapshot() {
    let sm = populated();
    let names: BTreeSet<String> = STATE_TABLES.iter().map(|t| t.name().to_string()).collect();
    assert_eq!(names.len(), STATE_TABLES.len(), "a table is registered twice");
    let txn = sm.b.db.db.begin_read().unwrap();
    for table in txn.list_tables().unwrap() {
        let name = table.name().to_string();
        assert!(
            name == SNAPSHOT.name() || name == SNAPSHOT_CHUNKS.name() || names.contains(&name),
            "table {name:?} is not in schema::STATE_TABLES"
        );
    }
    assert_eq!(txn.list_multimap_tables().unwrap().count(), 0, "a multimap table is not snapshotted");
    drop(txn);
    let before = rows(&sm.b.db);
    for (name, rows) in &before {
        assert!(!rows.is_empty(), "the fixture leaves table {name:?} empty: extend `populated()`");
    }
    let copy = sm.install_copy();
    assert_eq!(rows(&copy.b.db), before);
    assert_eq!(copy.state, sm.state);
    let copy = copy.reopen();
    assert_eq!(rows(&copy.b.db), before);
    assert_eq!(copy.state, sm.state);
}

/// A file in another layout is refused with an error that says what to do, never misread.
#[test]
fn a_state_file_of_another_layout_is_refused() {
    let write_meta = |key: &str, value: &[u8]| {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().insert(key, value).unwrap();
        txn.commit().unwrap();
        dir
    };
    // The layout before the table registry: no format key, `last_applied` in the meta.
    let old = write_meta("last_applied", &encode(&None::<u64>).unwrap());
    let err =
        StateDb::open(old.path(), crate::store::TEST_CACHE_BYTES).err().expect("an old layout is refused").to_string();
    assert!(err.contains("an older one") && err.contains("fresh data dir"), "{err}");
    let newer = write_meta("format", &encode(&(super::state::STATE_FORMAT + 1)).unwrap());
    let err = StateDb::open(newer.path(), crate::store::TEST_CACHE_BYTES)
        .err()
        .expect("a newer layout is refused")
        .to_string();
    assert!(err.contains(&format!("layout {}", super::state::STATE_FORMAT + 1)), "{err}");
    // A fresh file gets the format, and opens again.
    let fresh = tempfile::tempdir().unwrap();
    drop(StateDb::open(fresh.path(), crate::store::TEST_CACHE_BYTES).unwrap());
    StateDb::open(fresh.path(), crate::store::TEST_CACHE_BYTES).unwrap();
}

#[test]
fn a_state_file_that_cannot_be_opened_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    std::fs::create_dir(&path).unwrap();
    let err = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).err().expect("a directory is no state file");
    assert!(err.to_string().starts_with(&format!("{}: ", path.display())), "{err}");
    assert!(path.is_dir(), "nothing is made in its place");
}

#[test]
fn install_refuses_a_snapshot_with_an_unknown_or_repeated_table() {
    let sm = populated();
    let fresh = RedbBackend::fresh();
    let install = |extra: (String, Rows)| {
        let mut tables: Vec<(String, Rows)> = rows(&sm.b.db).into_iter().collect();
        tables.push(extra);
        fresh.db.install(&encode(&Body { tables }).unwrap(), b"applied", 1, &[b"snapshot"]).unwrap_err().to_string()
    };
    let err = install(("from_a_newer_build".into(), vec![(b"k".to_vec(), b"v".to_vec())]));
    assert!(err.contains("from_a_newer_build"), "{err}");
    let err = install(("devices".into(), Vec::new()));
    assert!(err.contains("\"devices\" twice"), "{err}");
    // Layout 2's route table beside layout 3's device rows: neither is taken.
    let err = install(("routes".into(), Vec::new()));
    assert!(err.contains("\"devices\" and the tables it replaced"), "{err}");
}

/// `populated()`'s device rows as layout 2 kept them: (routes, floors), redb key bytes and codec
/// values.
fn legacy_rows(sm: &Sm<RedbBackend>) -> (Rows, Rows) {
    let (mut routes, mut floors) = (Rows::new(), Rows::new());
    for (k, v) in &rows(&sm.b.db)["devices"] {
        let row: DeviceRow = decode(v).unwrap();
        if let Some(r) = row.route {
            routes.push((k.clone(), encode(&r).unwrap()));
        }
        if let Some(f) = row.floor {
            floors.push((k.clone(), encode(&f).unwrap()));
        }
    }
    (routes, floors)
}

/// A node not yet upgraded sends a snapshot of layout 2 (routes and floors in tables of their
/// own): it installs as the same state, and the cluster goes on from it.
#[test]
fn install_reads_a_snapshot_of_layout_2() {
    let mut sm = populated();
    let (routes, floors) = legacy_rows(&sm);
    assert!(!routes.is_empty() && !floors.is_empty());
    // A device that released its route keeps only its floor.
    sm.entry(vec![machine::Release { device: "d1".into(), conn: 7 }.into()]);
    let (routes, floors) = legacy_rows(&sm);
    assert_eq!((routes.len(), floors.len()), (1, 2), "d2 holds a route, d1 only its floor");
    let mut tables: Vec<(String, Rows)> = rows(&sm.b.db).into_iter().filter(|(n, _)| n != "devices").collect();
    tables.push(("routes".into(), routes));
    tables.push(("route_floor".into(), floors));
    let dump = sm.b.db.dump().unwrap();
    let applied = dump.applied.unwrap();
    let mut copy = Sm::<RedbBackend>::empty();
    let state = restore(copy.b.db.install(&encode(&Body { tables }).unwrap(), &applied, 9, &[b"snapshot"]).unwrap());
    (copy.index, copy.term) = (sm.index, sm.term);
    assert_eq!(rows(&copy.b.db), rows(&sm.b.db));
    assert_eq!(state, sm.state);
    assert_eq!(copy.b.route("d1"), sm.b.route("d1"));
    assert_eq!(copy.b.route("d2").0.map(|r| r.conn), Some(8));
    // Claims go on over the installed rows: d1's floor still fences an old attempt.
    copy.state = state;
    let replies = copy.entry(vec![testkit::claim("d1", 1, 9, 0, 1), testkit::claim("d1", 1, 9, 0, 2)]);
    assert!(matches!(replies[0], Reply::Claim(machine::ClaimReply::Stale { .. })), "{replies:?}");
    assert!(matches!(replies[1], Reply::Claim(machine::ClaimReply::Accepted { version: 2, .. })), "{replies:?}");
}

/// An apply reads a device's row from the row cache when it holds it. An install replaces every
/// row, so the rows the cache held before must not answer after it: claims are judged by the
/// installed rows (a floor the snapshot raised, a device it does not hold), as on every node.
#[test]
fn claims_after_an_install_are_judged_by_the_installed_rows_not_the_cached_ones() {
    let mut ahead = populated();
    ahead.entry(vec![testkit::claim("d1", 1, 9, 0, 5)]);
    let mut behind = populated();
    behind.entry(vec![testkit::claim("d4", 1, 11, 0, 5)]);
    assert!(behind.b.db.cached_route("d1").is_some() && behind.b.db.cached_route("d4").is_some(), "cached before");
    behind.install_from(&ahead);
    let claims = vec![testkit::claim("d1", 1, 12, 0, 3), testkit::claim("d4", 1, 12, 0, 1)];
    for sm in [&mut behind, &mut ahead] {
        let replies = sm.entry(claims.clone());
        assert!(matches!(replies[0], Reply::Claim(machine::ClaimReply::Stale { .. })), "{replies:?}");
        assert!(matches!(replies[1], Reply::Claim(machine::ClaimReply::Accepted { version: 1, .. })), "{replies:?}");
    }
    assert_eq!(rows(&behind.b.db), rows(&ahead.b.db));
}

/// `sm`'s state as layout `format` (2 or 3) stored it, in `sm`'s file: the per-node route table
/// and each lease row's route count, and (layout 2) the device rows split into a route table and
/// a floor table.
fn as_older_layout(sm: Sm<RedbBackend>, format: u32) -> TempDir {
    let (routes, floors) = legacy_rows(&sm);
    let pairs: Vec<(NodeId, String)> = sm.b.db.index.lock().unwrap().pairs().map(|(n, d)| (n, d.to_string())).collect();
    let RedbBackend { dir, db } = sm.b;
    let txn = db.db.begin_write().unwrap();
    {
        let mut index = txn.open_table(NODE_ROUTES).unwrap();
        for (node, device) in &pairs {
            index.insert((*node, device.as_str()), ()).unwrap();
        }
        let mut leases = txn.open_table(NODES).unwrap();
        for (node, lease) in &sm.state.nodes {
            leases.insert(*node, encode(lease).unwrap().as_slice()).unwrap();
        }
        if format == 2 {
            txn.delete_table(DEVICES).unwrap();
            for (def, rows) in [(LEGACY_ROUTES, &routes), (LEGACY_FLOORS, &floors)] {
                let mut t = txn.open_table(def).unwrap();
                for (k, v) in rows {
                    t.insert(std::str::from_utf8(k).unwrap(), v.as_slice()).unwrap();
                }
            }
        }
        txn.open_table(META).unwrap().insert("format", encode(&format).unwrap().as_slice()).unwrap();
    }
    txn.commit().unwrap();
    dir
}

/// A state file of layout 2 or 3 is migrated in place when the node starts: every device keeps
/// its route and floor, every lease its route count, the old tables are gone, it opens again as
/// the current layout, and the rebuilt route index finds a node's routes.
#[test]
fn a_state_file_of_layout_2_or_3_is_migrated() {
    for format in [2, 3] {
        let sm = populated();
        let (state, (index, term)) = (sm.state.clone(), (sm.index, sm.term));
        let expected: Vec<_> = ["d1", "d2", "never"].iter().map(|d| sm.b.route(d)).collect();
        assert!(expected[0].0.is_some() && expected[1].0.is_some() && expected[2] == (None, None));
        assert_eq!(state.nodes[&1].routes, 2);
        let dir = as_older_layout(sm, format);
        for _ in 0..2 {
            let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
            assert_eq!(restore(loaded), state, "layout {format}");
            let got: Vec<_> = ["d1", "d2", "never"].iter().map(|d| db.route(d).unwrap()).collect();
            assert_eq!(got, expected);
            let txn = db.db.begin_read().unwrap();
            let names: BTreeSet<String> = txn.list_tables().unwrap().map(|t| t.name().to_string()).collect();
            for old in ["routes", "route_floor", "node_routes"] {
                assert!(!names.contains(old), "{old} is left in {names:?}");
            }
            let format: u32 = decode(txn.open_table(META).unwrap().get("format").unwrap().unwrap().value()).unwrap();
            assert_eq!(format, super::state::STATE_FORMAT);
            let lease: NodeLease = decode(txn.open_table(NODES).unwrap().get(1).unwrap().unwrap().value()).unwrap();
            assert_eq!(lease.routes, 0, "a stored lease row holds no route count");
        }
        let (db, loaded) = StateDb::open(dir.path(), crate::store::TEST_CACHE_BYTES).unwrap();
        let mut sm = Sm::<RedbBackend>::empty();
        (sm.b, sm.state, sm.index, sm.term) = (RedbBackend { dir, db }, restore(loaded), index, term);
        let replies = sm.entry(vec![machine::ReleaseNode { node: 1 }.into()]);
        assert!(matches!(replies[..], [Reply::ReleaseNode(2)]), "{replies:?}");
        assert_eq!(sm.b.route("d2").0, None);
        assert_eq!(sm.state.nodes[&1].routes, 0);
    }
}

/// A snapshot carries what layout 3 stored (the per-node route table, each lease's route count),
/// so a node not yet upgraded installs it as its own; this build skips that table and counts the
/// routes from the device rows, as it does on open.
#[test]
fn a_snapshot_carries_the_route_index_as_layout_3_stored_it() {
    let sm = populated();
    let dump = sm.b.db.dump().unwrap();
    let mut body: Body = decode(&dump.data).unwrap();
    let table = |body: &Body, name: &str| body.tables.iter().find(|(n, _)| n == name).map(|(_, rows)| rows.clone());
    let index: Vec<(NodeId, String)> = table(&body, "node_routes")
        .expect("the snapshot carries node_routes")
        .iter()
        .map(|(k, v)| {
            assert!(v.is_empty());
            let (node, device) = <(NodeId, &str) as redb::Value>::from_bytes(k);
            (node, device.to_string())
        })
        .collect();
    assert_eq!(index, [(1, "d1".to_string()), (1, "d2".to_string())]);
    let leases = table(&body, "nodes").unwrap();
    let lease: NodeLease = decode(&leases[0].1).unwrap();
    assert_eq!(lease.routes, 2);
    // The table is skipped on install: wrong rows in it change nothing.
    for (name, rows) in &mut body.tables {
        if name == "node_routes" {
            rows.truncate(1);
        }
    }
    let applied = dump.applied.unwrap();
    let copy = Sm::<RedbBackend>::empty();
    let state = restore(copy.b.db.install(&encode(&body).unwrap(), &applied, 9, &[b"snapshot"]).unwrap());
    assert_eq!(state, sm.state);
    assert_eq!(rows(&copy.b.db), rows(&sm.b.db));
    assert_eq!(copy.b.dump(), sm.b.dump());
}

/// The snapshot written straight from the tables (`store::snapshot`) is, byte for byte, what
/// bincode makes of every table's rows, the lease route counts and layout 3's route index (the
/// encoding every earlier build sends and reads): counts and lengths past one byte's varint
/// (over 250 rows and keys), several nodes, released routes and floors alone included.
#[test]
fn a_snapshot_is_byte_for_byte_the_bincode_of_its_tables() {
    let mut sm = populated();
    sm.entry(vec![testkit::renew(2, 0, 1 << 40), testkit::renew(3, 0, 1 << 40)]);
    let long = "l".repeat(300);
    let mut claims: Vec<_> = (0..600).map(|i| testkit::claim(&format!("dev-{i:04}"), 1 + i % 3, i, 0, 1)).collect();
    claims.push(testkit::claim(&long, 3, 9, 0, 1));
    sm.entry(claims);
    sm.entry((0..600).step_by(7).map(|i| machine::Release { device: format!("dev-{i:04}"), conn: i }.into()).collect());
    let dump = sm.b.db.dump().unwrap();
    let mut tables: Vec<(String, Rows)> = Vec::new();
    let index = sm.b.db.index.lock().unwrap();
    let all = rows(&sm.b.db);
    for t in STATE_TABLES {
        let mut rows = all[t.name()].clone();
        if t.name() == TableHandle::name(&NODES) {
            for (k, v) in &mut rows {
                let lease: NodeLease = decode(v).unwrap();
                *v = encode(&NodeLease { routes: index.count(<NodeId as redb::Value>::from_bytes(k)), ..lease })
                    .unwrap();
            }
        }
        tables.push((t.name().to_string(), rows));
    }
    let pairs = index.pairs().map(|pair| (<(NodeId, &str) as redb::Value>::as_bytes(&pair), Vec::new()));
    tables.push((TableHandle::name(&NODE_ROUTES).to_string(), pairs.collect()));
    assert!(tables[0].1.len() > 600 && tables.last().unwrap().1.len() > 500, "the counts take several bytes");
    assert_eq!(dump.data, encode(&Body { tables }).unwrap());
}

/// A damaged snapshot is refused with an error, and the state it would have replaced stays: cut
/// short, with trailing bytes, a length past its end, a table name that is not UTF-8, more tables
/// than any build knows, or a row redb cannot read as its table's types (a device id that is not
/// UTF-8, a node id of three bytes: redb panics reading those, and the node with it).
#[test]
fn install_refuses_a_damaged_snapshot_and_keeps_the_state() {
    let sm = populated();
    let dump = sm.b.db.dump().unwrap();
    let applied = dump.applied.unwrap();
    let copy = Sm::<RedbBackend>::empty();
    let before = rows(&copy.b.db);
    let data = &dump.data;
    let long = [&data[..], &[0]].concat();
    // One table whose name claims 10,000 bytes (a varint marked 0xFB: two bytes follow).
    let past = [&[crate::codec::VERSION, 1, 0xFB, 0x10, 0x27][..], b"devices"].concat();
    let mut not_utf8 = data.clone();
    not_utf8[3] = 0xFF;
    // 1,000 tables claimed, more than any build knows.
    let many = vec![crate::codec::VERSION, 0xFB, 0xE8, 0x03, 0];
    let unreadable = |table: &str, key: Vec<u8>| {
        let mut tables: Vec<(String, Rows)> = rows(&sm.b.db).into_iter().collect();
        tables.iter_mut().find(|(n, _)| n == table).unwrap().1[0].0 = key;
        encode(&Body { tables }).unwrap()
    };
    let cases = [
        ("cut", data[..data.len() / 2].to_vec(), ""),
        ("long", long, "trailing"),
        ("past", past, "10000 bytes runs past the end"),
        ("not utf-8", not_utf8, ""),
        ("many", many, "claims 1000 tables"),
        ("device id", unreadable("devices", vec![0xFF, 0xFE]), "row of table \"devices\" that redb cannot read"),
        ("node id", unreadable("nodes", vec![1, 0, 0]), "row of table \"nodes\" that redb cannot read"),
    ];
    for (what, bad, says) in cases {
        let err = copy.b.db.install(&bad, &applied, 9, &[b"snapshot"]).unwrap_err().to_string();
        assert!(!err.is_empty() && err.contains(says), "{what}: {err}");
        assert_eq!(rows(&copy.b.db), before, "{what}: nothing was replaced");
    }
    assert_eq!(copy.b.db.read_snapshot().unwrap(), None);
}

#[test]
fn a_built_snapshot_never_replaces_a_newer_one() {
    let b = RedbBackend::fresh();
    b.db.save_snapshot(5, &[b"five"]).unwrap();
    b.db.save_snapshot(3, &[b"three"]).unwrap();
    assert_eq!(b.db.read_snapshot().unwrap().as_deref(), Some(&b"five"[..]));
    b.db.save_snapshot(6, &[b"six"]).unwrap();
    assert_eq!(b.db.read_snapshot().unwrap().as_deref(), Some(&b"six"[..]));
}

/// The tenants the metrics export: the busiest first (ties by name), at most `keep`, and the
/// count of all of them.
#[test]
fn busiest_tenants_keeps_the_most_connected_and_counts_all() {
    let mut sm = Sm::<RedbBackend>::new();
    let mut cmds = vec![machine::Init { cluster_id: "c".into() }.into(), testkit::renew(1, 0, 1 << 40)];
    // Tenant tK gets K connected devices; "a" and "b" one each (a tie, broken by name).
    for (tenant, devices) in [("t3", 3u64), ("t1", 1), ("t5", 5), ("b", 1), ("a", 1), ("t0", 0)] {
        cmds.push(
            machine::SetTenantPolicy { tenant: tenant.into(), max_connections: None, publishes: None, at_ms: 0 }.into(),
        );
        for i in 0..devices {
            let claim = machine::Claim { device: format!("{tenant}-{i}"), node: 1, conn: i + 1, epoch: 0, attempt: 1 };
            cmds.push(machine::ClaimTenant { claim, tenant: tenant.into() }.into());
        }
    }
    sm.entry(cmds);
    let db = &sm.b.db;
    let (total, rows) = db.busiest_tenants(4).unwrap();
    assert_eq!(total, 6);
    let got: Vec<(&str, u64)> = rows.iter().map(|(t, r)| (t.as_str(), r.connections)).collect();
    assert_eq!(got, [("t5", 5), ("t3", 3), ("a", 1), ("b", 1)]);
    let (total, rows) = db.busiest_tenants(0).unwrap();
    assert_eq!((total, rows.len()), (6, 0));
}

/// `routes` answers what `route` answers for each device, in order, in one read.
#[test]
fn routes_reads_many_devices_as_route_reads_one() {
    let sm = populated();
    let devices: Vec<String> = ["d2", "nobody", "d1"].map(String::from).to_vec();
    let one_by_one: Vec<_> = devices.iter().map(|d| sm.b.db.route(d).unwrap()).collect();
    assert!(one_by_one[0].0.is_some() && one_by_one[1] == (None, None) && one_by_one[2].1.is_some());
    assert_eq!(sm.b.db.routes(&devices).unwrap(), one_by_one);
}
