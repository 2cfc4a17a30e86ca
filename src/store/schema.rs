//! The `state.redb` schema: every table of the replicated state, and the ONE registry that
//! opening, snapshot dump, snapshot install and clearing iterate. A table of the state that is
//! not in [`STATE_TABLES`] would be lost on the first snapshot: `store::tests` fails if one is
//! opened outside it.

use redb::{
    Key, ReadTransaction, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle, Value, WriteTransaction,
};

use super::StoreError;

/// device → its route (while connected) and floor (once it claimed), one row (codec
/// `state::DeviceRow`): a claim reads one row and writes one, where separate route and floor
/// tables cost two B-tree inserts (each copying a leaf) and two dirty pages to checksum and write.
pub(super) const DEVICES: TableDefinition<&str, &[u8]> = TableDefinition::new("devices");
/// Layout 2's device → route and device → floor tables (codec): read only to migrate a file or
/// install a snapshot of that layout, never written.
pub(super) const LEGACY_ROUTES: TableDefinition<&str, &[u8]> = TableDefinition::new("routes");
pub(super) const LEGACY_FLOORS: TableDefinition<&str, &[u8]> = TableDefinition::new("route_floor");
/// (node, device) for every route: layout 3's per-node route index. Kept in memory since layout 4
/// (`store::index`): never stored, only written into snapshots (so that a layout-3 node installs
/// them) and skipped when one is installed.
pub(super) const NODE_ROUTES: TableDefinition<(u64, &str), ()> = TableDefinition::new("node_routes");
/// node → lease (codec). The lease's route count is not kept up to date here: it is counted from
/// the route index when the state loads.
pub(super) const NODES: TableDefinition<u64, &[u8]> = TableDefinition::new("nodes");
/// Cluster id, ring version and the Raft adapter's applied meta (codec).
pub(super) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
/// (device, seq) → message (codec).
pub(super) const STREAMS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("streams");
/// device → stream head (codec).
pub(super) const HEADS: TableDefinition<&str, &[u8]> = TableDefinition::new("stream_heads");
/// (device, idempotency key) → its use: seq and time (codec).
pub(super) const IDEMPOTENCY: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("idempotency");
/// (device, used at ms, seq) → idempotency key: a device's keys oldest first, for the window and
/// the count bound.
pub(super) const KEY_ORDER: TableDefinition<(&str, u64, u64), &str> = TableDefinition::new("key_order");
/// device → the tenant its last accepted claim named.
pub(super) const DEVICE_TENANTS: TableDefinition<&str, &str> = TableDefinition::new("device_tenant");
/// tenant → its plan, connections and this period's totals (codec).
pub(super) const TENANTS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenants");
/// (tenant, period, consumption id) → ledger entry (codec).
pub(super) const LEDGER: TableDefinition<(&str, u64, &str), &[u8]> = TableDefinition::new("quota_ledger");
/// seq → cluster event (codec): the bounded membership and ring change log (`machine::events`).
pub(super) const CLUSTER_EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("cluster_events");

/// Not state: the last built (or installed) snapshot, kept for followers that need it: its order
/// and length (and, in files written before chunks, the whole of it); see `store::kept`.
pub(super) const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");
/// Not state: that snapshot's bytes, in chunks (`store::kept::CHUNK`).
pub(super) const SNAPSHOT_CHUNKS: TableDefinition<u32, &[u8]> = TableDefinition::new("snapshot_chunks");

/// Every table of the replicated state. Open, dump, install and clear iterate this list.
pub(super) static STATE_TABLES: [&dyn RawTable; 11] = [
    &DEVICES,
    &NODES,
    &META,
    &STREAMS,
    &HEADS,
    &IDEMPOTENCY,
    &KEY_ORDER,
    &DEVICE_TENANTS,
    &TENANTS,
    &LEDGER,
    &CLUSTER_EVENTS,
];

/// A table's rows as redb's own key and value bytes, in key order. Snapshots carry these: their
/// layout is redb's fixed-width/length-prefixed encoding of the key and value types above (stable
/// within redb's file format), the values themselves being codec-versioned bytes.
pub(super) type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// A table handled by name and raw bytes, whatever its key and value types.
pub(super) trait RawTable: Sync {
    fn name(&self) -> &str;
    /// Creates the table if it does not exist.
    fn create(&self, txn: &WriteTransaction) -> Result<(), StoreError>;
    /// Every row, copied, read in a write transaction (creating the table if it is missing).
    fn rows_in(&self, txn: &WriteTransaction) -> Result<Rows, StoreError>;
    /// How many rows the table holds (redb keeps the count: no scan).
    fn len(&self, txn: &ReadTransaction) -> Result<u64, StoreError>;
    /// Hands every row's key and value bytes to `each`, in key order, without copying them.
    fn each_row(&self, txn: &ReadTransaction, each: &mut RowFn<'_>) -> Result<(), StoreError>;
    /// Replaces every row with `rows`.
    fn replace<'a>(&self, txn: &WriteTransaction, rows: &mut RowIter<'a, '_>) -> Result<(), StoreError>;
}

/// What [`RawTable::each_row`] calls with each row.
pub(super) type RowFn<'f> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'f;
/// Rows as [`RawTable::replace`] takes them: borrowed key and value bytes.
pub(super) type RowIter<'a, 'i> = dyn Iterator<Item = Result<(&'a [u8], &'a [u8]), StoreError>> + 'i;

impl<K: Key + Sync + 'static, V: Value + Sync + 'static> RawTable for TableDefinition<'static, K, V> {
    fn name(&self) -> &str {
        TableHandle::name(self)
    }

    fn create(&self, txn: &WriteTransaction) -> Result<(), StoreError> {
        txn.open_table(*self)?;
        Ok(())
    }

    fn rows_in(&self, txn: &WriteTransaction) -> Result<Rows, StoreError> {
        raw_rows(&txn.open_table(*self)?)
    }

    fn len(&self, txn: &ReadTransaction) -> Result<u64, StoreError> {
        Ok(txn.open_table(*self)?.len()?)
    }

    fn each_row(&self, txn: &ReadTransaction, each: &mut RowFn<'_>) -> Result<(), StoreError> {
        for row in txn.open_table(*self)?.iter()? {
            let (k, v) = row?;
            each(K::as_bytes(&k.value()).as_ref(), V::as_bytes(&v.value()).as_ref())?;
        }
        Ok(())
    }

    fn replace<'a>(&self, txn: &WriteTransaction, rows: &mut RowIter<'a, '_>) -> Result<(), StoreError> {
        txn.delete_table(*self)?;
        let mut table = txn.open_table(*self)?;
        for row in rows {
            let (k, v) = row?;
            // redb reads a key or value of these types by panicking on bytes it cannot read (a
            // string that is not UTF-8, an integer of another width): in a damaged snapshot that
            // is an error, and the install's transaction is dropped (the default panic hook still
            // prints redb's message once).
            let typed = std::panic::catch_unwind(|| (K::from_bytes(k), V::from_bytes(v))).map_err(|_| {
                StoreError::Corrupt(format!(
                    "the snapshot holds a row of table {:?} that redb cannot read",
                    RawTable::name(self)
                ))
            })?;
            table.insert(typed.0, typed.1)?;
        }
        Ok(())
    }
}

fn raw_rows<K: Key + 'static, V: Value + 'static>(table: &impl ReadableTable<K, V>) -> Result<Rows, StoreError> {
    let mut rows = Vec::new();
    for row in table.iter()? {
        let (k, v) = row?;
        rows.push((K::as_bytes(&k.value()).as_ref().to_vec(), V::as_bytes(&v.value()).as_ref().to_vec()));
    }
    Ok(rows)
}
