//! `state.redb`: the applied state machine's tables (see `store::schema`). Applies commit
//! without fsync (an apply that writes no table read elsewhere, such as a claim's or a release's,
//! may leave its transaction open for the next: `store::held`), with the Raft adapter's applied
//! meta in the same transaction, so a crash replays from the log; building or installing a
//! snapshot commits durably, so the state on disk is never behind a purged log. An apply's transaction is [`StateTxn`] (`store::txn`). Callers run every
//! function here on the blocking pool.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableHandle, WriteTransaction,
};
use serde::{Deserialize, Serialize};

use super::held::{self, Held, Hold};
use super::index::RouteIndex;
use super::kept;
use super::rows::RowCache;
use super::schema::{
    RawTable, Rows, CLUSTER_EVENTS, DEVICES, HEADS, LEDGER, LEGACY_FLOORS, LEGACY_ROUTES, META, NODES, NODE_ROUTES,
    SNAPSHOT, SNAPSHOT_CHUNKS, STATE_TABLES, STREAMS, TENANTS,
};
use super::snapshot::{self, Section};
pub use super::txn::StateTxn;
use super::StoreError;
use crate::codec::{decode, encode};
use crate::machine::{ClusterEvent, Entry, Floor, Head, Message, NodeLease, Route, State, StreamRead, TenantRow};

/// The layout of this file, written when it is created: a file of another layout is migrated
/// (from 2 or 3) or refused with a clear error, never misread. 2: the table registry
/// (`store::schema`) and the adapter's applied meta under one key; 3: a device's route and floor
/// in one row (`devices`); 4: the per-node route index in memory (`store::index`), no longer a
/// table, and a lease row's route count no longer kept up to date on disk.
const FORMAT: &str = "format";
pub const STATE_FORMAT: u32 = 4;
/// The layouts [`StateDb::open`] migrates in place (snapshots of 2 and 3 install too).
const MIGRATED_FORMATS: [u32; 2] = [2, 3];
pub(super) const RING_VERSION: &str = "ring_version";
pub(super) const CLUSTER_ID: &str = "cluster_id";
pub(super) const CLOCK_MS: &str = "clock_ms";
pub(super) const EXTENDED_TERM: &str = "extended_term";
pub(super) const ADMISSION: &str = "admission";
/// Added in issue 15 under new keys (a file without them loads the defaults: no format bump).
pub(super) const EVENT_SEQ: &str = "event_seq";
pub(super) const SCALE_IN: &str = "scale_in";
pub(super) const CAPACITY: &str = "capacity";
pub(super) const MAX_CONNECTIONS: &str = "max_connections";
/// The Raft adapter's applied meta (last applied log id, membership): opaque here.
pub(super) const APPLIED: &str = "applied";

/// What a database holds on open or after an install: the machine's in-memory state (without the
/// membership, which is in the adapter's applied meta) and that meta.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    pub state: State,
    pub applied: Option<Vec<u8>>,
}

/// The whole state from one read transaction, and the applied meta it was read at.
pub struct Dump {
    pub applied: Option<Vec<u8>>,
    pub data: Vec<u8>,
}

/// A device's route (if connected) and floor (if it ever claimed).
pub type RouteAndFloor = (Option<Route>, Option<Floor>);

/// A row of `devices`: what layout 2 kept in two tables. A row exists while either is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct DeviceRow {
    pub(super) route: Option<Route>,
    pub(super) floor: Option<Floor>,
}

impl DeviceRow {
    pub(super) fn split(self) -> RouteAndFloor {
        (self.route, self.floor)
    }
}

/// Layout 2's route and floor rows (redb key bytes, codec values) merged into `devices` rows,
/// in key order.
pub(super) fn merge_legacy(routes: &Rows, floors: &Rows) -> Result<Rows, StoreError> {
    let mut merged: BTreeMap<Vec<u8>, DeviceRow> = BTreeMap::new();
    for (k, v) in routes {
        merged.entry(k.clone()).or_default().route = Some(decode(v)?);
    }
    for (k, v) in floors {
        merged.entry(k.clone()).or_default().floor = Some(decode(v)?);
    }
    merged.into_iter().map(|(k, row)| Ok((k, encode(&row)?))).collect()
}

/// Handle on `state.redb`. Cheap to clone.
#[derive(Clone)]
pub struct StateDb {
    /// The apply transaction left open for the next apply, if any (`store::held`). First, so
    /// that the last clone's drop commits it before it closes the database.
    pub(super) hold: Arc<Hold>,
    pub(super) db: Arc<Database>,
    /// The per-node route index of the applied state: locked by an apply (applies run one at a
    /// time) and replaced by an install.
    pub(super) index: Arc<Mutex<RouteIndex>>,
    /// The applied device rows, up to 1/[`ROW_CACHE_SHARE`] of the page cache's bytes: written by
    /// an apply (under the index's lock) and refilled by an open or an install.
    pub(super) rows: Arc<RowCache>,
}

/// The row cache's budget is the page cache's bytes divided by this (32 MiB of the default
/// 256 MiB: 85,000–89,000 rows at 16- to 36-byte device ids, more than the 57,000-device fleet).
pub const ROW_CACHE_SHARE: usize = 8;

impl StateDb {
    /// Opens (or creates) `state.redb` in `dir` with a page cache of `cache_bytes` (and a row
    /// cache of 1/[`ROW_CACHE_SHARE`] of that) and creates every table once. A file written in
    /// another layout is refused (see [`STATE_FORMAT`]).
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<(StateDb, Loaded), StoreError> {
        StateDb::open_holding(dir, cache_bytes, held::configured())
    }

    /// [`StateDb::open`] with an apply transaction held open for at most `hold_for` (zero: every
    /// apply commits; see `store::held`).
    pub(super) fn open_holding(
        dir: &Path,
        cache_bytes: usize,
        hold_for: Duration,
    ) -> Result<(StateDb, Loaded), StoreError> {
        let path = dir.join("state.redb");
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(StoreError::from)
            .map_err(StoreError::opening(&path))?;
        let txn = db.begin_write()?;
        for t in STATE_TABLES {
            t.create(&txn)?;
        }
        txn.open_table(SNAPSHOT)?;
        txn.open_table(SNAPSHOT_CHUNKS)?;
        {
            let mut meta = txn.open_table(META)?;
            let format: Option<u32> = get(&meta, FORMAT)?;
            match format {
                Some(STATE_FORMAT) => {}
                Some(from) if MIGRATED_FORMATS.contains(&from) => {
                    drop(meta);
                    migrate(&txn, from)?;
                    tracing::info!(path = %path.display(), "migrated the state file from layout {from} to {STATE_FORMAT}");
                }
                None if meta.is_empty()? => {
                    meta.insert(FORMAT, encode(&STATE_FORMAT)?.as_slice())?;
                }
                found => {
                    let found = found.map_or_else(|| "an older one".to_string(), |f| f.to_string());
                    return Err(StoreError::Incompatible(format!(
                        "{} is in layout {found}, this build reads layout {STATE_FORMAT}: start this node with a \
                         fresh data dir (remove the old identity with `gateway leave`, then join the new one)",
                        path.display()
                    )));
                }
            }
        }
        txn.commit()?;
        let rows = Arc::new(RowCache::new(cache_bytes / ROW_CACHE_SHARE));
        let db = StateDb { hold: Arc::new(Hold::start(hold_for)), db: Arc::new(db), index: Arc::default(), rows };
        let loaded = db.load()?;
        Ok((db, loaded))
    }

    /// The index, whatever a panicked holder left: every holder replaces or changes it only
    /// after its transaction committed.
    fn index(&self) -> MutexGuard<'_, RouteIndex> {
        self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reads the state back and rebuilds the route index and the row cache from the device rows
    /// (after an open or an install): each lease's route count is the index's.
    fn load(&self) -> Result<Loaded, StoreError> {
        let mut held = self.index();
        let txn = self.db.begin_read()?;
        self.rows.clear();
        let mut room = self.rows.budget();
        let index = RouteIndex::build(&txn.open_table(DEVICES)?, |device, row| {
            if let Some(left) = room.checked_sub(RowCache::weight_of(device)) {
                room = left;
                self.rows.put(device, row.split());
            }
        })?;
        let meta = txn.open_table(META)?;
        let get = |k: &str| -> Result<Option<Vec<u8>>, StoreError> { Ok(meta.get(k)?.map(|v| v.value().to_vec())) };
        let mut nodes = BTreeMap::new();
        for row in txn.open_table(NODES)?.iter()? {
            let (k, v) = row?;
            let lease = NodeLease { routes: index.count(k.value()), ..decode(v.value())? };
            nodes.insert(k.value(), lease);
        }
        *held = index;
        drop(held);
        let state = State {
            cluster_id: get(CLUSTER_ID)?.map(|b| decode(&b)).transpose()?.flatten(),
            ring_version: get(RING_VERSION)?.map(|b| decode(&b)).transpose()?.unwrap_or_default(),
            clock_ms: get(CLOCK_MS)?.map(|b| decode(&b)).transpose()?.unwrap_or_default(),
            extended_term: get(EXTENDED_TERM)?.map(|b| decode(&b)).transpose()?.unwrap_or_default(),
            admission: get(ADMISSION)?.map(|b| decode(&b)).transpose()?.flatten(),
            event_seq: get(EVENT_SEQ)?.map(|b| decode(&b)).transpose()?.unwrap_or_default(),
            scale_in: get(SCALE_IN)?.map(|b| decode(&b)).transpose()?.flatten(),
            capacity: get(CAPACITY)?.map(|b| decode(&b)).transpose()?.unwrap_or_default(),
            max_connections: get(MAX_CONNECTIONS)?.map(|b| decode(&b)).transpose()?.unwrap_or_default(),
            // The adapter restores the membership from `applied`.
            members: BTreeMap::new(),
            voters: Default::default(),
            nodes,
        };
        Ok(Loaded { state, applied: get(APPLIED)? })
    }

    /// Runs one apply (not fsynced); `f` applies through the [`StateTxn`] and ends with
    /// [`StateTxn::save`]. The device rows it changed are written back at its end; its
    /// transaction commits, or stays open for the next apply when it wrote no table read outside
    /// the applies (see `store::held`). Its route moves and rows are what the route index,
    /// the row cache and [`StateDb::route`] answer from then on. An error is fatal to the node
    /// (openraft stops): the applies of a held transaction are lost with it, and replayed from the
    /// log on the next start; the row cache is emptied so that it answers nothing they changed.
    pub fn apply<R>(&self, f: impl FnOnce(&mut StateTxn<'_>) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let mut index = self.index();
        let mut slot = self.hold.lock();
        let run = |held: &Held| {
            let mut tx = StateTxn::open(&held.txn, &index, &self.rows);
            let out = f(&mut tx)?;
            let holdable = tx.holdable();
            Ok::<_, StoreError>((out, tx.write_back()?, holdable))
        };
        // On an error the held applies are lost (a failed commit leaves the database refusing
        // writes, so the next begin fails too): nothing may answer the rows they changed.
        let lost = |e: StoreError| {
            self.hold.forget();
            self.rows.clear();
            Err(e)
        };
        let held = match slot.take().map_or_else(|| Held::begin(&self.db), Ok) {
            Ok(held) => held,
            Err(e) => return lost(e),
        };
        let (out, (moves, changed), holdable) = match run(&held) {
            Ok(done) => done,
            Err(e) => {
                drop(held);
                return lost(e);
            }
        };
        index.apply(moves);
        let keep = holdable && self.hold.keeps(&held, changed.len());
        // The row cache and the held rows share the transaction's copy of each id (`Arc<str>`).
        if keep {
            self.hold.changed(changed.iter().cloned());
        }
        for (device, row) in changed {
            self.rows.put(device, row.split());
        }
        *slot = Some(held);
        if !keep {
            if let Err(e) = self.hold.commit(&mut slot) {
                return lost(e);
            }
        }
        Ok(out)
    }

    /// Commits the held apply transaction, if any (a dump, a snapshot's save and an install
    /// read or write past it).
    pub(super) fn commit_held(&self) -> Result<MutexGuard<'_, Option<Held>>, StoreError> {
        let mut slot = self.hold.lock();
        if let Err(e) = self.hold.commit(&mut slot) {
            // The held applies are lost (see `apply`): nothing may answer the rows they changed.
            self.rows.clear();
            return Err(e);
        }
        Ok(slot)
    }

    /// A device's route and floor from the row cache, when it holds them: what
    /// [`StateDb::route`] reads, without a transaction (so also on an async worker).
    pub fn cached_route(&self, device: &str) -> Option<RouteAndFloor> {
        self.rows.get(device)
    }

    /// A device's route and floor.
    pub fn route(&self, device: &str) -> Result<RouteAndFloor, StoreError> {
        if let Some(row) = self.hold.row(device) {
            return Ok(row.split());
        }
        let txn = self.db.begin_read()?;
        let row: Option<DeviceRow> = get(&txn.open_table(DEVICES)?, device)?;
        Ok(row.unwrap_or_default().split())
    }

    /// [`StateDb::route`] of each device: the held rows, then one read transaction for the others
    /// (each device's answer is as new as `route`'s; two devices' may be of two moments).
    pub fn routes(&self, devices: &[String]) -> Result<Vec<RouteAndFloor>, StoreError> {
        let held: Vec<Option<DeviceRow>> = devices.iter().map(|d| self.hold.row(d)).collect();
        let txn = self.db.begin_read()?;
        let table = txn.open_table(DEVICES)?;
        let read = |d: &String, held: Option<DeviceRow>| match held {
            Some(row) => Ok(row.split()),
            None => Ok(get::<_, DeviceRow>(&table, d.as_str())?.unwrap_or_default().split()),
        };
        devices.iter().zip(held).map(|(d, held)| read(d, held)).collect()
    }

    /// A tenant's row and its last `limit` ledger entries in (period, consumption id) order.
    pub fn tenant(&self, tenant: &str, limit: usize) -> Result<(Option<TenantRow>, LedgerRows), StoreError> {
        let txn = self.db.begin_read()?;
        let row: Option<TenantRow> = get(&txn.open_table(TENANTS)?, tenant)?;
        let ledger = txn.open_table(LEDGER)?;
        let mut entries = Vec::new();
        for r in ledger.range((tenant, 0, "")..=(tenant, u64::MAX, ""))?.rev().take(limit) {
            let (k, v) = r?;
            let (_, period, id) = k.value();
            entries.push((period, id.to_string(), decode(v.value())?));
        }
        entries.reverse();
        Ok((row, entries))
    }

    /// How many tenants there are, and the `keep` with the most connections (ties by name), most
    /// first. Holds at most `keep` rows whatever the number of tenants.
    pub fn busiest_tenants(&self, keep: usize) -> Result<(u64, Vec<(String, TenantRow)>), StoreError> {
        use std::cmp::Reverse;
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TENANTS)?;
        let mut total = 0u64;
        // Min-heap on (connections, Reverse(name)): the root is the first to drop.
        let mut heap = std::collections::BinaryHeap::new();
        let mut kept = BTreeMap::new();
        for r in table.iter()? {
            let (k, v) = r?;
            let row: TenantRow = decode(v.value())?;
            let name = k.value().to_string();
            total += 1;
            heap.push(Reverse((row.connections, Reverse(name.clone()))));
            kept.insert(name, row);
            if heap.len() > keep {
                if let Some(Reverse((_, Reverse(out)))) = heap.pop() {
                    kept.remove(&out);
                }
            }
        }
        let order = heap.into_sorted_vec().into_iter().map(|Reverse((_, Reverse(name)))| name);
        let rows = order.filter_map(|name| kept.remove(&name).map(|row| (name, row))).collect();
        Ok((total, rows))
    }

    /// A device's stream bounds and up to `limit` retained messages with seq > `after`.
    pub fn stream(&self, device: &str, after: u64, limit: usize) -> Result<StreamRead, StoreError> {
        self.stream_page(device, after, limit, usize::MAX)
    }

    /// Like [`StateDb::stream`], and stops once the payloads read reach `max_bytes` (one message
    /// at least): what a session holds in memory for one page of a `sync`.
    pub fn stream_page(
        &self,
        device: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<StreamRead, StoreError> {
        let txn = self.db.begin_read()?;
        let head: Head = get(&txn.open_table(HEADS)?, device)?.unwrap_or_default();
        let mut messages = Vec::new();
        let mut bytes = 0usize;
        if limit > 0 && after < head.head {
            let streams = txn.open_table(STREAMS)?;
            for row in streams.range((device, after.saturating_add(1))..=(device, head.head))? {
                let (k, v) = row?;
                let message: Message = decode(v.value())?;
                bytes = bytes.saturating_add(message.payload.len());
                messages.push((k.value().1, message));
                if messages.len() >= limit || bytes >= max_bytes {
                    break;
                }
            }
        }
        Ok(StreamRead { head, messages })
    }

    /// Up to `limit` events of the cluster event log with seq > `after`, oldest first.
    pub fn cluster_events(&self, after: u64, limit: usize) -> Result<Vec<ClusterEvent>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(CLUSTER_EVENTS)?;
        let mut out = Vec::new();
        for row in table.range(after.saturating_add(1)..)?.take(limit) {
            let (_, v) = row?;
            out.push(decode(v.value())?);
        }
        Ok(out)
    }

    /// Serializes every registered table from one read transaction (applies may run concurrently;
    /// see `store::snapshot`).
    pub fn dump(&self) -> Result<Dump, StoreError> {
        drop(self.commit_held()?);
        let txn = self.db.begin_read()?;
        let applied = txn.open_table(META)?.get(APPLIED)?.map(|v| v.value().to_vec());
        Ok(Dump { applied, data: snapshot::write(&txn)? })
    }

    /// Replaces the whole state with a snapshot's `data` (read in place: `store::snapshot`),
    /// recorded as applied at `applied`, and keeps the snapshot itself (at `order`; its bytes are
    /// `snapshot`'s parts, in order) as the current one — durably, in one transaction.
    pub fn install(&self, data: &[u8], applied: &[u8], order: u64, snapshot: &[&[u8]]) -> Result<Loaded, StoreError> {
        let (legacy_routes, legacy_floors) = (TableHandle::name(&LEGACY_ROUTES), TableHandle::name(&LEGACY_FLOORS));
        let node_routes = TableHandle::name(&NODE_ROUTES);
        let mut tables: BTreeMap<&str, Section> = BTreeMap::new();
        for (name, rows) in snapshot::read(data)? {
            let known = [legacy_routes, legacy_floors, node_routes].contains(&name);
            if !known && !STATE_TABLES.iter().any(|t| t.name() == name) {
                return Err(StoreError::Corrupt(format!("the snapshot carries table {name:?}, unknown to this build")));
            }
            if tables.insert(name, rows).is_some() {
                return Err(StoreError::Corrupt(format!("the snapshot carries table {name:?} twice")));
            }
        }
        // The route index is rebuilt from the device rows (`load`); so are the route counts.
        tables.remove(node_routes);
        let leases = TableHandle::name(&NODES);
        let stored_leases = match tables.remove(leases) {
            Some(rows) => stored_leases(&rows.to_rows()?)?,
            None => Rows::new(),
        };
        // A snapshot of layout 2 (sent by a node not yet upgraded) keeps routes and floors apart.
        let mut merged = None;
        if tables.contains_key(legacy_routes) || tables.contains_key(legacy_floors) {
            let devices = TableHandle::name(&DEVICES);
            if tables.contains_key(devices) {
                let msg = format!("the snapshot carries table {devices:?} and the tables it replaced");
                return Err(StoreError::Corrupt(msg));
            }
            let mut take = |name| tables.remove(name).map(Section::to_rows).transpose().map(Option::unwrap_or_default);
            let (routes, floors) = (take(legacy_routes)?, take(legacy_floors)?);
            merged = Some(merge_legacy(&routes, &floors)?);
        }
        // No apply opens a transaction until this one committed (the slot stays locked); the
        // held one commits first, since only one writes at a time.
        let slot = self.commit_held()?;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        // No row of the replaced state may answer after the commit; `load` refills the cache.
        self.rows.clear();
        for t in STATE_TABLES {
            let name = t.name();
            if name == leases {
                t.replace(&txn, &mut snapshot::owned_rows(&stored_leases))?;
            } else if let Some(merged) = merged.as_ref().filter(|_| name == TableHandle::name(&DEVICES)) {
                t.replace(&txn, &mut snapshot::owned_rows(merged))?;
            } else if let Some(rows) = tables.get(name) {
                t.replace(&txn, &mut rows.rows())?;
            } else {
                t.replace(&txn, &mut std::iter::empty())?;
            }
        }
        txn.open_table(META)?.insert(APPLIED, applied)?;
        kept::put(&txn, order, snapshot, true)?;
        txn.commit()?;
        drop(slot);
        self.load()
    }

    /// Stores a built snapshot (its bytes: `snapshot`'s parts, in order) durably unless a newer
    /// one (by `order`) is stored: a build runs beside applies and installs, and an install may
    /// have stored a newer one meanwhile. The `Immediate` commit also makes every earlier
    /// non-durable apply durable, so the state on disk is at least as new as any snapshot that
    /// lets openraft purge the log.
    pub fn save_snapshot(&self, order: u64, snapshot: &[&[u8]]) -> Result<(), StoreError> {
        // The held applies (newer than the snapshot, which a dump read after committing them)
        // become durable with it.
        self.commit_durably(|txn| kept::put(txn, order, snapshot, false))
    }

    /// Makes every apply so far durable, committing what is held first, as a snapshot's save
    /// does without the snapshot: a crash then replays the log from here, and redb settles the
    /// pages that non-durable commits freed (it reuses them only after a durable commit).
    pub fn sync(&self) -> Result<(), StoreError> {
        self.commit_durably(|_| Ok(()))
    }

    /// Commits what is held, then `write`s in a transaction of its own committed durably (so a
    /// failed `write` never takes the held applies along); no apply opens a transaction until
    /// this one committed (the slot stays locked).
    fn commit_durably(
        &self,
        write: impl FnOnce(&WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let _slot = self.commit_held()?;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        write(&txn)?;
        txn.commit()?;
        Ok(())
    }

    /// The current snapshot's bytes, as stored by [`StateDb::save_snapshot`] or
    /// [`StateDb::install`] (`store::kept`): one copy of them, no more than a chunk besides.
    pub fn read_snapshot(&self) -> Result<Option<Vec<u8>>, StoreError> {
        kept::read(&self.db.begin_read()?)
    }
}

/// Layout 2 or 3 → 4 in the opening transaction: (from 2) the route and floor tables merged
/// into `devices` and deleted, the per-node route table deleted (`load` builds the index), and
/// the new format recorded.
fn migrate(txn: &WriteTransaction, from: u32) -> Result<(), StoreError> {
    if from == 2 {
        let merged = merge_legacy(&LEGACY_ROUTES.rows_in(txn)?, &LEGACY_FLOORS.rows_in(txn)?)?;
        RawTable::replace(&DEVICES, txn, &mut snapshot::owned_rows(&merged))?;
        txn.delete_table(LEGACY_ROUTES)?;
        txn.delete_table(LEGACY_FLOORS)?;
    }
    txn.delete_table(NODE_ROUTES)?;
    let leases = stored_leases(&RawTable::rows_in(&NODES, txn)?)?;
    RawTable::replace(&NODES, txn, &mut snapshot::owned_rows(&leases))?;
    txn.open_table(META)?.insert(FORMAT, encode(&STATE_FORMAT)?.as_slice())?;
    Ok(())
}

/// Lease rows (redb key bytes, codec values) as layout 4 stores them: with a route count of 0,
/// whatever it was (`load` counts the routes), so that every node's file holds the same bytes
/// for the same applied log, however its applies were batched.
fn stored_leases(rows: &Rows) -> Result<Rows, StoreError> {
    rows.iter().map(|(k, v)| Ok((k.clone(), encode(&stored_lease(&decode(v)?))?))).collect()
}

/// A lease as layout 4 stores it (see [`stored_leases`]).
pub(super) fn stored_lease(lease: &NodeLease) -> NodeLease {
    NodeLease { routes: 0, ..lease.clone() }
}

pub(super) fn get<'a, K, T>(
    table: &impl ReadableTable<K, &'static [u8]>,
    key: impl std::borrow::Borrow<K::SelfType<'a>>,
) -> Result<Option<T>, StoreError>
where
    K: redb::Key + 'static,
    T: serde::de::DeserializeOwned,
{
    Ok(table.get(key)?.map(|v| decode(v.value())).transpose()?)
}

/// Ledger entries as read: (period, consumption id, entry), oldest first.
pub type LedgerRows = Vec<(u64, String, Entry)>;
