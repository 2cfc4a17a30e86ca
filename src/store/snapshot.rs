//! A snapshot's data, written straight from `state.redb`'s tables and read back as slices of
//! itself: every registered table's rows (redb's key and value bytes) by table name, the bytes
//! that bincode gives a `{ tables: Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)> }` — what every layout
//! since 2 sends — without a `Vec` for each row or serde's byte-at-a-time sequences (a snapshot
//! of a million devices is ~56 MB). No other module knows the layout.

use std::collections::BTreeMap;

use redb::{ReadTransaction, TableHandle};

use super::schema::{Rows, DEVICES, NODES, NODE_ROUTES, STATE_TABLES};
use super::state::DeviceRow;
use super::StoreError;
use crate::codec::{self, decode, encode, put_bytes, put_len, Reader};
use crate::machine::{NodeId, NodeLease};

/// Every registered table's rows from one read transaction, then what layout 3 stored besides
/// (so that a node not yet upgraded installs the snapshot as it would its own): each lease row's
/// route count, and the per-node route index as a table, both counted from the device rows as
/// they are written.
pub(super) fn write(txn: &ReadTransaction) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![codec::VERSION];
    put_len(&mut out, STATE_TABLES.len() + 1);
    // (node, where the device's key starts in `out`) of every route, in device order.
    let mut routes: Vec<(NodeId, usize)> = Vec::new();
    let mut counts: BTreeMap<NodeId, u64> = BTreeMap::new();
    for t in STATE_TABLES {
        put_bytes(&mut out, t.name().as_bytes());
        let len = t.len(txn)?;
        put_len(&mut out, len as usize);
        let mut written = 0u64;
        if t.name() == TableHandle::name(&DEVICES) {
            t.each_row(txn, &mut |k, v| {
                let at = out.len();
                put_bytes(&mut out, k);
                put_bytes(&mut out, v);
                if let Some(route) = decode::<DeviceRow>(v)?.route {
                    routes.push((route.node, at));
                    *counts.entry(route.node).or_default() += 1;
                }
                written += 1;
                Ok(())
            })?;
        } else if t.name() == TableHandle::name(&NODES) {
            // `devices` comes first in the registry: every route is counted by now.
            debug_assert_eq!(
                STATE_TABLES[0].name(),
                TableHandle::name(&DEVICES),
                "the lease counts need the devices first"
            );
            t.each_row(txn, &mut |k, v| {
                let node = <NodeId as redb::Value>::from_bytes(k);
                let routes = counts.get(&node).copied().unwrap_or(0);
                put_bytes(&mut out, k);
                put_bytes(&mut out, &encode(&NodeLease { routes, ..decode(v)? })?);
                written += 1;
                Ok(())
            })?;
        } else {
            t.each_row(txn, &mut |k, v| {
                put_bytes(&mut out, k);
                put_bytes(&mut out, v);
                written += 1;
                Ok(())
            })?;
        }
        if written != len {
            return Err(StoreError::Corrupt(format!("table {:?} counts {len} rows but holds {written}", t.name())));
        }
    }
    put_bytes(&mut out, TableHandle::name(&NODE_ROUTES).as_bytes());
    put_len(&mut out, routes.len());
    // By node, then device (a stable sort keeps the devices' key order): the table's key order.
    routes.sort_by_key(|&(node, _)| node);
    for (node, at) in routes {
        let pair = {
            let key = Reader::new(&out[at..]).next_bytes()?;
            let device = <&str as redb::Value>::from_bytes(key);
            <(NodeId, &str) as redb::Value>::as_bytes(&(node, device))
        };
        put_bytes(&mut out, &pair);
        put_bytes(&mut out, &[]);
    }
    Ok(out)
}

/// One table of a snapshot: its rows, still encoded, as a slice of the snapshot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Section<'a> {
    count: u64,
    bytes: &'a [u8],
}

impl<'a> Section<'a> {
    /// The rows: (key, value) as redb stores them, in the snapshot's order.
    pub(super) fn rows(self) -> impl Iterator<Item = Result<(&'a [u8], &'a [u8]), StoreError>> {
        let mut r = Reader::new(self.bytes);
        (0..self.count).map(move |_| Ok((r.next_bytes()?, r.next_bytes()?)))
    }

    /// The rows copied out (for the few that are rewritten before they are stored).
    pub(super) fn to_rows(self) -> Result<Rows, StoreError> {
        self.rows().map(|row| row.map(|(k, v)| (k.to_vec(), v.to_vec()))).collect()
    }
}

/// A snapshot's tables, in its order, each as a slice of `data`; a snapshot cut short, with
/// trailing bytes or with a name that is not UTF-8 is refused.
pub(super) fn read(data: &[u8]) -> Result<Vec<(&str, Section<'_>)>, StoreError> {
    let mut r = Reader::new(codec::versioned(data)?);
    let tables = r.next_len()?;
    // No build knows more tables than the registry and the three of older layouts (a name may
    // not repeat): a larger count is refused before anything is read.
    if tables > STATE_TABLES.len() as u64 + 3 {
        return Err(StoreError::Corrupt(format!("the snapshot claims {tables} tables")));
    }
    let mut out = Vec::new();
    for _ in 0..tables {
        let name = std::str::from_utf8(r.next_bytes()?)
            .map_err(|_| StoreError::Corrupt("the snapshot names a table in bytes that are not UTF-8".into()))?;
        let count = r.next_len()?;
        let start = r.rest();
        for _ in 0..count {
            r.next_bytes()?;
            r.next_bytes()?;
        }
        let bytes = &start[..start.len() - r.rest().len()];
        out.push((name, Section { count, bytes }));
    }
    r.finish()?;
    Ok(out)
}

/// Rows already in memory as an iterator of the shape [`Section::rows`] gives.
pub(super) fn owned_rows(rows: &Rows) -> impl Iterator<Item = Result<(&[u8], &[u8]), StoreError>> {
    rows.iter().map(|(k, v)| Ok((k.as_slice(), v.as_slice())))
}
