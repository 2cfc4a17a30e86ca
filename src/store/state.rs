//! `state.redb`: the applied state machine's tables (see `store::schema`). Applies commit
//! without fsync, with the Raft adapter's applied meta in the same transaction, so a crash replays
//! from the log; building or installing a snapshot commits durably, so the state on disk is never
//! behind a purged log. Callers run every function here on the blocking pool.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, Table, TableDefinition,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};

use super::schema::{
    Rows, CLUSTER_EVENTS, DEVICE_TENANTS, FLOORS, HEADS, IDEMPOTENCY, KEY_ORDER, LEDGER, META, NODES, NODE_ROUTES,
    ROUTES, SNAPSHOT, STATE_TABLES, STREAMS, TENANTS,
};
use super::StoreError;
use crate::codec::{decode, encode};
use crate::machine::{
    ClusterEvent, Entry, Floor, Head, KeyUse, Message, NodeId, Route, State, StreamRead, Tables, TenantRow,
};

/// The layout of this file, written when it is created: a file of another layout is refused
/// with a clear error, never misread. 2: the table registry (`store::schema`) and the adapter's
/// applied meta under one key.
const FORMAT: &str = "format";
pub const STATE_FORMAT: u32 = 2;
const RING_VERSION: &str = "ring_version";
const CLUSTER_ID: &str = "cluster_id";
const CLOCK_MS: &str = "clock_ms";
const EXTENDED_TERM: &str = "extended_term";
const ADMISSION: &str = "admission";
/// Added in issue 15 under new keys (a file without them loads the defaults: no format bump).
const EVENT_SEQ: &str = "event_seq";
const SCALE_IN: &str = "scale_in";
const CAPACITY: &str = "capacity";
const MAX_CONNECTIONS: &str = "max_connections";
/// The Raft adapter's applied meta (last applied log id, membership): opaque here.
const APPLIED: &str = "applied";
const CURRENT_SNAPSHOT: &str = "current";

/// What a database holds on open or after an install: the machine's in-memory state (without the
/// membership, which is in the adapter's applied meta) and that meta.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    pub state: State,
    pub applied: Option<Vec<u8>>,
}

/// A snapshot's data: every registered table's rows, by table name.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SnapshotBody {
    tables: Vec<(String, Rows)>,
}

/// The whole state from one read transaction, and the applied meta it was read at.
pub struct Dump {
    pub applied: Option<Vec<u8>>,
    pub data: Vec<u8>,
}

/// A device's route (if connected) and floor (if it ever claimed).
pub type RouteAndFloor = (Option<Route>, Option<Floor>);

/// Handle on `state.redb`. Cheap to clone.
#[derive(Clone)]
pub struct StateDb {
    pub(super) db: Arc<Database>,
}

impl StateDb {
    /// Opens (or creates) `state.redb` in `dir` with a page cache of `cache_bytes` and creates
    /// every table once. A file written in another layout is refused (see [`STATE_FORMAT`]).
    pub fn open(dir: &Path, cache_bytes: usize) -> Result<(StateDb, Loaded), StoreError> {
        let path = dir.join("state.redb");
        let db = redb::Builder::new().set_cache_size(cache_bytes).create(&path)?;
        let txn = db.begin_write()?;
        for t in STATE_TABLES {
            t.create(&txn)?;
        }
        txn.open_table(SNAPSHOT)?;
        {
            let mut meta = txn.open_table(META)?;
            let format: Option<u32> = get(&meta, FORMAT)?;
            match format {
                Some(STATE_FORMAT) => {}
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
        let db = StateDb { db: Arc::new(db) };
        let loaded = db.load()?;
        Ok((db, loaded))
    }

    fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let get = |k: &str| -> Result<Option<Vec<u8>>, StoreError> { Ok(meta.get(k)?.map(|v| v.value().to_vec())) };
        let mut nodes = BTreeMap::new();
        for row in txn.open_table(NODES)?.iter()? {
            let (k, v) = row?;
            nodes.insert(k.value(), decode(v.value())?);
        }
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

    /// Runs one apply transaction (not fsynced); `f` applies through the [`StateTxn`] and ends
    /// with [`StateTxn::save`].
    pub fn apply<R>(&self, f: impl FnOnce(&mut StateTxn<'_>) -> Result<R, StoreError>) -> Result<R, StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::None)?;
        let out = f(&mut StateTxn::open(&txn))?;
        txn.commit()?;
        Ok(out)
    }

    /// A device's route and floor.
    pub fn route(&self, device: &str) -> Result<RouteAndFloor, StoreError> {
        let txn = self.db.begin_read()?;
        let route = get(&txn.open_table(ROUTES)?, device)?;
        let floor = get(&txn.open_table(FLOORS)?, device)?;
        Ok((route, floor))
    }

    /// [`StateDb::route`] of each device, in one read transaction.
    pub fn routes(&self, devices: &[String]) -> Result<Vec<RouteAndFloor>, StoreError> {
        let txn = self.db.begin_read()?;
        let (routes, floors) = (txn.open_table(ROUTES)?, txn.open_table(FLOORS)?);
        devices.iter().map(|d| Ok((get(&routes, d.as_str())?, get(&floors, d.as_str())?))).collect()
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

    /// Serializes every registered table from one read transaction (applies may run concurrently).
    pub fn dump(&self) -> Result<Dump, StoreError> {
        let txn = self.db.begin_read()?;
        let applied = txn.open_table(META)?.get(APPLIED)?.map(|v| v.value().to_vec());
        let mut body = SnapshotBody::default();
        for t in STATE_TABLES {
            body.tables.push((t.name().to_string(), t.rows(&txn)?));
        }
        Ok(Dump { applied, data: encode(&body)? })
    }

    /// Replaces the whole state with a snapshot's `data`, recorded as applied at `applied`, and
    /// keeps the snapshot itself (`order`, `snapshot`) as the current one — durably, in one
    /// transaction.
    pub fn install(&self, data: &[u8], applied: &[u8], order: u64, snapshot: &[u8]) -> Result<Loaded, StoreError> {
        let body: SnapshotBody = decode(data)?;
        let mut tables: BTreeMap<&str, &Rows> = BTreeMap::new();
        for (name, rows) in &body.tables {
            if !STATE_TABLES.iter().any(|t| t.name() == name) {
                return Err(StoreError::Corrupt(format!("the snapshot carries table {name:?}, unknown to this build")));
            }
            if tables.insert(name, rows).is_some() {
                return Err(StoreError::Corrupt(format!("the snapshot carries table {name:?} twice")));
            }
        }
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        let none = Rows::new();
        for t in STATE_TABLES {
            t.replace(&txn, tables.get(t.name()).copied().unwrap_or(&none))?;
        }
        txn.open_table(META)?.insert(APPLIED, applied)?;
        put_snapshot(&txn, order, snapshot, true)?;
        txn.commit()?;
        self.load()
    }

    /// Stores a built snapshot durably unless a newer one (by `order`) is stored: a build runs
    /// beside applies and installs, and an install may have stored a newer one meanwhile. The
    /// `Immediate` commit also makes every earlier non-durable apply durable, so the state on disk
    /// is at least as new as any snapshot that lets openraft purge the log.
    pub fn save_snapshot(&self, order: u64, snapshot: &[u8]) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        put_snapshot(&txn, order, snapshot, false)?;
        txn.commit()?;
        Ok(())
    }

    /// The current snapshot, as stored by [`StateDb::save_snapshot`] or [`StateDb::install`].
    pub fn load_snapshot(&self) -> Result<Option<Vec<u8>>, StoreError> {
        let txn = self.db.begin_read()?;
        let stored: Option<(u64, Vec<u8>)> = get(&txn.open_table(SNAPSHOT)?, CURRENT_SNAPSHOT)?;
        Ok(stored.map(|(_, s)| s))
    }
}

fn put_snapshot(txn: &WriteTransaction, order: u64, snapshot: &[u8], replace: bool) -> Result<(), StoreError> {
    let mut t = txn.open_table(SNAPSHOT)?;
    let stored: Option<(u64, Vec<u8>)> = get(&t, CURRENT_SNAPSHOT)?;
    if replace || stored.is_none_or(|(o, _)| o < order) {
        t.insert(CURRENT_SNAPSHOT, encode(&(order, snapshot))?.as_slice())?;
    }
    Ok(())
}

fn get<'a, K, T>(
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

/// One table of an apply transaction, opened on first use: an entry touches a few of the
/// registry's tables, and each open one costs a lookup on open and another on commit.
struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    def: TableDefinition<'static, K, V>,
    table: OnceCell<Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(def: TableDefinition<'static, K, V>) -> Self {
        Lazy { def, table: OnceCell::new() }
    }

    fn get(&self, txn: &'t WriteTransaction) -> Result<&Table<'t, K, V>, StoreError> {
        if self.table.get().is_none() {
            // Never set meanwhile: `set` cannot fail here.
            let _ = self.table.set(txn.open_table(self.def)?);
        }
        Ok(self.table.get().expect("opened above"))
    }

    fn get_mut(&mut self, txn: &'t WriteTransaction) -> Result<&mut Table<'t, K, V>, StoreError> {
        self.get(txn)?;
        Ok(self.table.get_mut().expect("opened above"))
    }
}

/// The tables of one apply transaction, each opened once (when first used); the rules run over
/// them as [`Tables`].
pub struct StateTxn<'t> {
    txn: &'t WriteTransaction,
    routes: Lazy<'t, &'static str, &'static [u8]>,
    floors: Lazy<'t, &'static str, &'static [u8]>,
    node_routes: Lazy<'t, (u64, &'static str), ()>,
    nodes: Lazy<'t, u64, &'static [u8]>,
    meta: Lazy<'t, &'static str, &'static [u8]>,
    streams: Lazy<'t, (&'static str, u64), &'static [u8]>,
    heads: Lazy<'t, &'static str, &'static [u8]>,
    idem: Lazy<'t, (&'static str, &'static str), &'static [u8]>,
    key_order: Lazy<'t, (&'static str, u64, u64), &'static str>,
    device_tenants: Lazy<'t, &'static str, &'static str>,
    tenants: Lazy<'t, &'static str, &'static [u8]>,
    ledger: Lazy<'t, (&'static str, u64, &'static str), &'static [u8]>,
    cluster_events: Lazy<'t, u64, &'static [u8]>,
}

impl<'t> StateTxn<'t> {
    fn open(txn: &'t WriteTransaction) -> Self {
        StateTxn {
            txn,
            routes: Lazy::new(ROUTES),
            floors: Lazy::new(FLOORS),
            node_routes: Lazy::new(NODE_ROUTES),
            nodes: Lazy::new(NODES),
            meta: Lazy::new(META),
            streams: Lazy::new(STREAMS),
            heads: Lazy::new(HEADS),
            idem: Lazy::new(IDEMPOTENCY),
            key_order: Lazy::new(KEY_ORDER),
            device_tenants: Lazy::new(DEVICE_TENANTS),
            tenants: Lazy::new(TENANTS),
            ledger: Lazy::new(LEDGER),
            cluster_events: Lazy::new(CLUSTER_EVENTS),
        }
    }

    /// Persists what the applies changed in memory (`before` → `after`: lease rows, cluster id,
    /// ring version) and the adapter's applied meta, in this transaction.
    pub fn save(&mut self, before: &State, after: &State, applied: &[u8]) -> Result<(), StoreError> {
        // Every field named, so that a new one cannot be forgotten here (or in `load`). The
        // membership is persisted by the adapter, in `applied`.
        let State {
            cluster_id,
            ring_version,
            clock_ms,
            extended_term,
            admission,
            members: _,
            voters: _,
            nodes,
            event_seq,
            scale_in,
            capacity,
            max_connections,
        } = after;
        for (id, lease) in nodes {
            if before.nodes.get(id) != Some(lease) {
                self.nodes.get_mut(self.txn)?.insert(*id, encode(lease)?.as_slice())?;
            }
        }
        for id in before.nodes.keys().filter(|id| !nodes.contains_key(id)) {
            self.nodes.get_mut(self.txn)?.remove(*id)?;
        }
        // Only what changed: most entries change none of these, and each write is a B-tree
        // insert in every apply on every node.
        let meta = self.meta.get_mut(self.txn)?;
        if *ring_version != before.ring_version {
            meta.insert(RING_VERSION, encode(ring_version)?.as_slice())?;
        }
        if *cluster_id != before.cluster_id {
            meta.insert(CLUSTER_ID, encode(cluster_id)?.as_slice())?;
        }
        if *clock_ms != before.clock_ms {
            meta.insert(CLOCK_MS, encode(clock_ms)?.as_slice())?;
        }
        if *extended_term != before.extended_term {
            meta.insert(EXTENDED_TERM, encode(extended_term)?.as_slice())?;
        }
        if *admission != before.admission {
            meta.insert(ADMISSION, encode(admission)?.as_slice())?;
        }
        if before.event_seq != *event_seq {
            meta.insert(EVENT_SEQ, encode(event_seq)?.as_slice())?;
        }
        if before.scale_in != *scale_in {
            meta.insert(SCALE_IN, encode(scale_in)?.as_slice())?;
        }
        if before.capacity != *capacity {
            meta.insert(CAPACITY, encode(capacity)?.as_slice())?;
        }
        if before.max_connections != *max_connections {
            meta.insert(MAX_CONNECTIONS, encode(max_connections)?.as_slice())?;
        }
        meta.insert(APPLIED, applied)?;
        Ok(())
    }
}

impl Tables for StateTxn<'_> {
    type Error = StoreError;

    fn route(&self, device: &str) -> Result<Option<Route>, StoreError> {
        get(self.routes.get(self.txn)?, device)
    }
    fn put_route(&mut self, device: &str, route: &Route, replaces: Option<NodeId>) -> Result<(), StoreError> {
        self.routes.get_mut(self.txn)?.insert(device, encode(route)?.as_slice())?;
        // A device that reconnects to the same node keeps its index entry.
        if replaces != Some(route.node) {
            let index = self.node_routes.get_mut(self.txn)?;
            if let Some(old) = replaces {
                index.remove((old, device))?;
            }
            index.insert((route.node, device), ())?;
        }
        Ok(())
    }
    fn remove_route(&mut self, device: &str, node: NodeId) -> Result<(), StoreError> {
        self.routes.get_mut(self.txn)?.remove(device)?;
        self.node_routes.get_mut(self.txn)?.remove((node, device))?;
        Ok(())
    }
    fn node_devices(&self, node: NodeId) -> Result<Vec<String>, StoreError> {
        let mut devices = Vec::new();
        for row in self.node_routes.get(self.txn)?.range((node, "")..)? {
            let (k, _) = row?;
            let (n, device) = k.value();
            if n != node {
                break;
            }
            devices.push(device.to_string());
        }
        Ok(devices)
    }
    fn floor(&self, device: &str) -> Result<Option<Floor>, StoreError> {
        get(self.floors.get(self.txn)?, device)
    }
    fn put_floor(&mut self, device: &str, floor: &Floor) -> Result<(), StoreError> {
        self.floors.get_mut(self.txn)?.insert(device, encode(floor)?.as_slice())?;
        Ok(())
    }
    fn head(&self, device: &str) -> Result<Option<Head>, StoreError> {
        get(self.heads.get(self.txn)?, device)
    }
    fn put_head(&mut self, device: &str, head: &Head) -> Result<(), StoreError> {
        self.heads.get_mut(self.txn)?.insert(device, encode(head)?.as_slice())?;
        Ok(())
    }
    fn message(&self, device: &str, seq: u64) -> Result<Option<Message>, StoreError> {
        get(self.streams.get(self.txn)?, (device, seq))
    }
    fn put_message(&mut self, device: &str, seq: u64, msg: &Message) -> Result<(), StoreError> {
        self.streams.get_mut(self.txn)?.insert((device, seq), encode(msg)?.as_slice())?;
        Ok(())
    }
    fn remove_message(&mut self, device: &str, seq: u64) -> Result<(), StoreError> {
        self.streams.get_mut(self.txn)?.remove((device, seq))?;
        Ok(())
    }
    fn idempotent(&self, device: &str, key: &str) -> Result<Option<KeyUse>, StoreError> {
        get(self.idem.get(self.txn)?, (device, key))
    }
    fn put_idempotent(&mut self, device: &str, key: &str, used: KeyUse) -> Result<(), StoreError> {
        self.idem.get_mut(self.txn)?.insert((device, key), encode(&used)?.as_slice())?;
        self.key_order.get_mut(self.txn)?.insert((device, used.at_ms, used.seq), key)?;
        Ok(())
    }
    fn remove_idempotent(&mut self, device: &str, key: &str, used: KeyUse) -> Result<(), StoreError> {
        self.idem.get_mut(self.txn)?.remove((device, key))?;
        self.key_order.get_mut(self.txn)?.remove((device, used.at_ms, used.seq))?;
        Ok(())
    }
    fn oldest_key(&self, device: &str) -> Result<Option<(String, KeyUse)>, StoreError> {
        let mut rows = self.key_order.get(self.txn)?.range((device, 0, 0)..=(device, u64::MAX, u64::MAX))?;
        let Some(row) = rows.next() else { return Ok(None) };
        let (k, v) = row?;
        let (_, at_ms, seq) = k.value();
        Ok(Some((v.value().to_string(), KeyUse { seq, at_ms })))
    }
    fn device_tenant(&self, device: &str) -> Result<Option<String>, StoreError> {
        Ok(self.device_tenants.get(self.txn)?.get(device)?.map(|v| v.value().to_string()))
    }
    fn put_device_tenant(&mut self, device: &str, tenant: &str) -> Result<(), StoreError> {
        self.device_tenants.get_mut(self.txn)?.insert(device, tenant)?;
        Ok(())
    }
    fn remove_device_tenant(&mut self, device: &str) -> Result<(), StoreError> {
        self.device_tenants.get_mut(self.txn)?.remove(device)?;
        Ok(())
    }
    fn tenant(&self, tenant: &str) -> Result<Option<TenantRow>, StoreError> {
        get(self.tenants.get(self.txn)?, tenant)
    }
    fn put_tenant(&mut self, tenant: &str, row: &TenantRow) -> Result<(), StoreError> {
        self.tenants.get_mut(self.txn)?.insert(tenant, encode(row)?.as_slice())?;
        Ok(())
    }
    fn ledger(&self, tenant: &str, period: u64, id: &str) -> Result<Option<Entry>, StoreError> {
        get(self.ledger.get(self.txn)?, (tenant, period, id))
    }
    fn put_ledger(&mut self, tenant: &str, period: u64, id: &str, entry: &Entry) -> Result<(), StoreError> {
        self.ledger.get_mut(self.txn)?.insert((tenant, period, id), encode(entry)?.as_slice())?;
        Ok(())
    }
    fn prune_ledger(&mut self, tenant: &str, keep_from: u64) -> Result<(), StoreError> {
        if keep_from > 0 {
            self.ledger.get_mut(self.txn)?.retain_in((tenant, 0, "")..(tenant, keep_from, ""), |_, _| false)?;
        }
        Ok(())
    }
    fn put_cluster_event(&mut self, seq: u64, event: &ClusterEvent) -> Result<(), StoreError> {
        self.cluster_events.get_mut(self.txn)?.insert(seq, encode(event)?.as_slice())?;
        Ok(())
    }
    fn remove_cluster_event(&mut self, seq: u64) -> Result<(), StoreError> {
        self.cluster_events.get_mut(self.txn)?.remove(seq)?;
        Ok(())
    }
}
