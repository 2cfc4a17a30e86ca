//! One apply transaction on `state.redb` ([`StateTxn`]): the tables an entry touches, opened
//! once each, and the device rows it read or changed, written back once before the commit. The
//! rules of `machine` run over it as [`Tables`].

use std::cell::{OnceCell, RefCell};
use std::collections::BTreeMap;
use std::sync::Arc;

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::index::{Moves, RouteIndex};
use super::rows::RowCache;
use super::schema::{
    CLUSTER_EVENTS, DEVICES, DEVICE_TENANTS, HEADS, IDEMPOTENCY, KEY_ORDER, LEDGER, META, NODES, STREAMS, TENANTS,
};
use super::state::{
    get, stored_lease, DeviceRow, ADMISSION, APPLIED, CAPACITY, CLOCK_MS, CLUSTER_ID, EVENT_SEQ, EXTENDED_TERM,
    MAX_CONNECTIONS, RING_VERSION, SCALE_IN,
};
use super::StoreError;
use crate::codec::encode;
use crate::machine::{
    ClusterEvent, Entry, Floor, Head, KeyUse, Message, NodeId, NodeLease, Route, State, Tables, TenantRow,
};

/// One table of an apply transaction, opened on first use: an entry touches a few of the
/// registry's tables, and each open one costs a lookup on open and another on commit.
struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    def: TableDefinition<'static, K, V>,
    table: OnceCell<Table<'t, K, V>>,
    /// Written in this transaction (opened by `get_mut`).
    wrote: bool,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(def: TableDefinition<'static, K, V>) -> Self {
        Lazy { def, table: OnceCell::new(), wrote: false }
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
        self.wrote = true;
        Ok(self.table.get_mut().expect("opened above"))
    }
}

/// A device row as this transaction sees it, and whether it changed.
struct Cached {
    row: DeviceRow,
    dirty: bool,
}

/// The device rows an apply changed, by id: the transaction's own copy of each id, which the row
/// cache and the held rows (`store::held`) go on to share.
pub(super) type ChangedRows = Vec<(Arc<str>, DeviceRow)>;

/// The tables of one apply transaction, each opened once (when first used); the rules run over
/// them as [`Tables`].
pub struct StateTxn<'t> {
    txn: &'t WriteTransaction,
    devices: Lazy<'t, &'static str, &'static [u8]>,
    /// Device rows read or written so far, the changed ones written back once by
    /// [`StateTxn::write_back`] (in key order): a claim reads a floor and a route and writes
    /// both, one row read and one written. At most one row per device the transaction touches.
    rows: RefCell<BTreeMap<Arc<str>, Cached>>,
    /// The applied rows kept in memory ([`RowCache`]): a row it holds is the one this transaction
    /// reads from the table (written through after every apply, under the apply's lock), so a first read of a
    /// device it holds skips the B-tree walk.
    committed: &'t RowCache,
    /// The per-node route index as of the last apply, and this transaction's moves in it
    /// (applied by [`super::state::StateDb::apply`] once the apply succeeds).
    index: &'t RouteIndex,
    moves: Moves,
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
    pub(super) fn open(txn: &'t WriteTransaction, index: &'t RouteIndex, committed: &'t RowCache) -> Self {
        StateTxn {
            txn,
            devices: Lazy::new(DEVICES),
            rows: RefCell::new(BTreeMap::new()),
            committed,
            index,
            moves: Moves::new(),
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

    /// `device`'s row, read once per transaction (from the row cache when it holds it).
    fn row(&self, device: &str) -> Result<DeviceRow, StoreError> {
        if let Some(c) = self.rows.borrow().get(device) {
            return Ok(c.row.clone());
        }
        let row: DeviceRow = match self.committed.get(device) {
            Some((route, floor)) => DeviceRow { route, floor },
            None => get(self.devices.get(self.txn)?, device)?.unwrap_or_default(),
        };
        self.rows.borrow_mut().insert(device.into(), Cached { row: row.clone(), dirty: false });
        Ok(row)
    }

    /// Changes `device`'s row (written back at the end of the transaction).
    fn change_row(&mut self, device: &str, f: impl FnOnce(&mut DeviceRow)) -> Result<(), StoreError> {
        self.row(device)?;
        let mut rows = self.rows.borrow_mut();
        let cached = rows.get_mut(device).expect("read above");
        f(&mut cached.row);
        cached.dirty = true;
        Ok(())
    }

    /// Whether this transaction wrote none of the tables read outside the applies (by message
    /// delivery, the tenant API and the events API): the others are read there only by the route
    /// lookups (which read the held rows first), a dump (which commits first) and an open, so it
    /// may stay open for the next apply (`store::held`).
    pub(super) fn holdable(&self) -> bool {
        // Every field named, so that a new table cannot be forgotten here.
        let StateTxn {
            txn: _,
            devices: _,
            rows: _,
            committed: _,
            index: _,
            moves: _,
            nodes: _,
            meta: _,
            idem: _,
            key_order: _,
            device_tenants: _,
            streams,
            heads,
            tenants,
            ledger,
            cluster_events,
        } = self;
        ![streams.wrote, heads.wrote, tenants.wrote, ledger.wrote, cluster_events.wrote].contains(&true)
    }

    /// Writes the changed device rows (a row with neither a route nor a floor is deleted), and
    /// hands over the moves of the route index and the changed rows, to apply to the route index
    /// and the row cache once the transaction commits.
    pub(super) fn write_back(&mut self) -> Result<(Moves, ChangedRows), StoreError> {
        let mut changed = Vec::new();
        for (device, c) in std::mem::take(self.rows.get_mut()).into_iter().filter(|(_, c)| c.dirty) {
            let table = self.devices.get_mut(self.txn)?;
            if c.row == DeviceRow::default() {
                table.remove(&*device)?;
            } else {
                table.insert(&*device, encode(&c.row)?.as_slice())?;
            }
            changed.push((device, c.row));
        }
        Ok((std::mem::take(&mut self.moves), changed))
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
        // A lease row is stored without its route count (`StateDb::open` counts the route
        // index): a claim or a release, which changes only that, leaves the `nodes` table alone.
        let same = |a: &NodeLease, b: &NodeLease| NodeLease { routes: b.routes, ..a.clone() } == *b;
        for (id, lease) in nodes {
            if !before.nodes.get(id).is_some_and(|b| same(b, lease)) {
                self.nodes.get_mut(self.txn)?.insert(*id, encode(&stored_lease(lease))?.as_slice())?;
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
        Ok(self.row(device)?.route)
    }
    fn put_route(&mut self, device: &str, route: &Route, replaces: Option<NodeId>) -> Result<(), StoreError> {
        self.change_row(device, |row| row.route = Some(route.clone()))?;
        // A device that reconnects to the same node keeps its index entry.
        if replaces != Some(route.node) {
            if let Some(old) = replaces {
                self.moves.insert((old, device.to_string()), false);
            }
            self.moves.insert((route.node, device.to_string()), true);
        }
        Ok(())
    }
    fn remove_route(&mut self, device: &str, node: NodeId) -> Result<(), StoreError> {
        self.change_row(device, |row| row.route = None)?;
        self.moves.insert((node, device.to_string()), false);
        Ok(())
    }
    fn node_devices(&self, node: NodeId) -> Result<Vec<String>, StoreError> {
        Ok(self.index.devices(node, &self.moves))
    }
    fn floor(&self, device: &str) -> Result<Option<Floor>, StoreError> {
        Ok(self.row(device)?.floor)
    }
    fn put_floor(&mut self, device: &str, floor: &Floor) -> Result<(), StoreError> {
        self.change_row(device, |row| row.floor = Some(floor.clone()))
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
