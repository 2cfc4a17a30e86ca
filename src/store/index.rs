//! The per-node route index, kept in memory ([`RouteIndex`]): which devices hold a route naming
//! each node, so that a sweep (or a drain's release, or a removal) deletes a node's routes without
//! scanning every device. It is derived from the `devices` rows: built by one scan when the file
//! opens or a snapshot installs, then changed by each apply when it ends. Layout 3 kept it as
//! a table, which cost every claim and release a second B-tree write and a table root update in
//! the commit, on every node.
//!
//! Memory: one entry per route in the cluster (a device with a live connection, or an operator's
//! claim), 61–77 bytes each with 16- to 36-byte device ids (glibc's in-use bytes around building
//! 57,000 routes over three nodes, in random and in sorted order; a set just past a doubling holds
//! up to ~20 bytes a route more until it fills): 3.5–4.4 MB on every node for the 57,000-device
//! fleet. Routes are bounded by the nodes' connection limits, and the `devices` table holds the
//! same routes on disk.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use redb::ReadableTable;

use super::state::DeviceRow;
use super::StoreError;
use crate::codec::decode;
use crate::machine::NodeId;

/// An apply's changes to the index, applied once it ends: (node, device) → whether
/// the route now names the node.
pub(super) type Moves = BTreeMap<(NodeId, String), bool>;

/// node → the devices whose route names it. A hash set per node, not an ordered one: every
/// claim and release on every node changes it, and an ordered set of a few hundred thousand
/// boxed ids compared its way down some forty keys a change, each behind a pointer (a tenth of a
/// follower's CPU at 256 clients in the claims bench). The few readers that need device order
/// (a sweep's list, a dump) sort what they read. The hasher is std's keyed one: device ids come
/// from clients.
#[derive(Debug, Default)]
pub(super) struct RouteIndex {
    by_node: BTreeMap<NodeId, HashSet<Box<str>>>,
}

impl RouteIndex {
    /// The index of every route in `devices` (one scan), handing each row to `each` as well.
    /// The routes are gathered first (24 bytes each until the end) and each node's set is made
    /// at its size: grown one insert at a time, the routes were hashed again at every doubling
    /// (a quarter of an open's time at a million devices, in a profile of the apply bench).
    pub(super) fn build(
        devices: &impl ReadableTable<&'static str, &'static [u8]>,
        mut each: impl FnMut(&str, DeviceRow),
    ) -> Result<Self, StoreError> {
        let mut routes: Vec<(NodeId, Box<str>)> = Vec::new();
        let mut counts: BTreeMap<NodeId, usize> = BTreeMap::new();
        for row in devices.iter()? {
            let (k, v) = row?;
            let row: DeviceRow = decode(v.value())?;
            if let Some(route) = &row.route {
                routes.push((route.node, k.value().into()));
                *counts.entry(route.node).or_default() += 1;
            }
            each(k.value(), row);
        }
        let mut by_node: BTreeMap<NodeId, HashSet<Box<str>>> =
            counts.into_iter().map(|(node, n)| (node, HashSet::with_capacity(n))).collect();
        for (node, device) in routes {
            by_node.entry(node).or_default().insert(device);
        }
        Ok(RouteIndex { by_node })
    }

    /// How many routes name `node`.
    pub(super) fn count(&self, node: NodeId) -> u64 {
        self.by_node.get(&node).map_or(0, |d| d.len() as u64)
    }

    /// The devices whose route names `node`, with `moves` (of a transaction not yet committed)
    /// applied, in device order.
    pub(super) fn devices(&self, node: NodeId, moves: &Moves) -> Vec<String> {
        let mut devices: BTreeSet<&str> = self.by_node.get(&node).into_iter().flatten().map(|d| &**d).collect();
        for ((_, device), holds) in moves.range((node, String::new())..).take_while(|((n, _), _)| *n == node) {
            if *holds {
                devices.insert(device.as_str());
            } else {
                devices.remove(device.as_str());
            }
        }
        devices.into_iter().map(str::to_string).collect()
    }

    /// Applies a committed transaction's moves.
    pub(super) fn apply(&mut self, moves: Moves) {
        for ((node, device), holds) in moves {
            if holds {
                self.by_node.entry(node).or_default().insert(device.into_boxed_str());
            } else if let Some(devices) = self.by_node.get_mut(&node) {
                devices.remove(device.as_str());
                if devices.is_empty() {
                    self.by_node.remove(&node);
                }
            }
        }
    }

    /// Every (node, device) pair, in order.
    #[cfg(test)]
    pub(super) fn pairs(&self) -> impl Iterator<Item = (NodeId, &str)> {
        self.by_node.iter().flat_map(|(node, devices)| {
            let mut sorted: Vec<&str> = devices.iter().map(|d| &**d).collect();
            sorted.sort_unstable();
            sorted.into_iter().map(move |d| (*node, d))
        })
    }
}
