//! The small table interface the rules run over. `store` implements it on a redb write
//! transaction; `mem::MemTables` implements it on maps for the domain's own tests. The node
//! leases, membership and cluster id are not tables: they live in [`super::State`], in memory.

use super::events::ClusterEvent;
use super::stream::{Head, KeyUse, Message};
use super::tenant::{Entry, TenantRow};
use super::types::{Floor, NodeId, Route};

/// Point reads and writes of one apply transaction. Errors are the backend's (I/O, decoding) and
/// are fatal to the node; business refusals are replies, never errors.
pub trait Tables {
    type Error;

    fn route(&self, device: &str) -> Result<Option<Route>, Self::Error>;
    /// Stores the route and indexes it under its node, replacing the device's current route if
    /// it has one: `replaces` names that route's node (its index entry moves unless the node is
    /// the same).
    fn put_route(&mut self, device: &str, route: &Route, replaces: Option<NodeId>) -> Result<(), Self::Error>;
    /// Deletes the device's route and its index entry under `node`.
    fn remove_route(&mut self, device: &str, node: NodeId) -> Result<(), Self::Error>;
    /// Devices whose route names `node`, in device order.
    fn node_devices(&self, node: NodeId) -> Result<Vec<String>, Self::Error>;

    fn floor(&self, device: &str) -> Result<Option<Floor>, Self::Error>;
    fn put_floor(&mut self, device: &str, floor: &Floor) -> Result<(), Self::Error>;

    fn head(&self, device: &str) -> Result<Option<Head>, Self::Error>;
    fn put_head(&mut self, device: &str, head: &Head) -> Result<(), Self::Error>;
    fn message(&self, device: &str, seq: u64) -> Result<Option<Message>, Self::Error>;
    fn put_message(&mut self, device: &str, seq: u64, msg: &Message) -> Result<(), Self::Error>;
    fn remove_message(&mut self, device: &str, seq: u64) -> Result<(), Self::Error>;

    /// The use of one of the device's idempotency keys.
    fn idempotent(&self, device: &str, key: &str) -> Result<Option<KeyUse>, Self::Error>;
    /// Records a key's use and indexes it by (time, seq) for [`Tables::oldest_key`].
    fn put_idempotent(&mut self, device: &str, key: &str, used: KeyUse) -> Result<(), Self::Error>;
    /// Forgets a key (and its index entry: `used` is what was recorded).
    fn remove_idempotent(&mut self, device: &str, key: &str, used: KeyUse) -> Result<(), Self::Error>;
    /// The device's key used longest ago.
    fn oldest_key(&self, device: &str) -> Result<Option<(String, KeyUse)>, Self::Error>;

    /// The tenant of the device's last accepted claim, if its token named one.
    fn device_tenant(&self, device: &str) -> Result<Option<String>, Self::Error>;
    fn put_device_tenant(&mut self, device: &str, tenant: &str) -> Result<(), Self::Error>;
    fn remove_device_tenant(&mut self, device: &str) -> Result<(), Self::Error>;
    fn tenant(&self, tenant: &str) -> Result<Option<TenantRow>, Self::Error>;
    fn put_tenant(&mut self, tenant: &str, row: &TenantRow) -> Result<(), Self::Error>;
    /// A ledger entry of `tenant` in `period` under consumption id `id`.
    fn ledger(&self, tenant: &str, period: u64, id: &str) -> Result<Option<Entry>, Self::Error>;
    fn put_ledger(&mut self, tenant: &str, period: u64, id: &str, entry: &Entry) -> Result<(), Self::Error>;
    /// Deletes the tenant's ledger entries of periods before `keep_from`.
    fn prune_ledger(&mut self, tenant: &str, keep_from: u64) -> Result<(), Self::Error>;

    /// The cluster event log (see [`super::events`]): one event by its seq.
    fn put_cluster_event(&mut self, seq: u64, event: &ClusterEvent) -> Result<(), Self::Error>;
    fn remove_cluster_event(&mut self, seq: u64) -> Result<(), Self::Error>;
}

/// In-memory tables: the reference backend for the domain's tests (and the model they compare
/// the redb backend against).
#[cfg(test)]
pub mod mem {
    use std::collections::{BTreeMap, BTreeSet};
    use std::convert::Infallible;

    use super::*;

    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct MemTables {
        pub routes: BTreeMap<String, Route>,
        pub node_routes: BTreeSet<(NodeId, String)>,
        pub floors: BTreeMap<String, Floor>,
        pub heads: BTreeMap<String, Head>,
        pub messages: BTreeMap<(String, u64), Message>,
        pub idempotency: BTreeMap<(String, String), KeyUse>,
        /// (device, at_ms, seq) → key: the keys in the order they were used.
        pub key_order: BTreeMap<(String, u64, u64), String>,
        pub device_tenants: BTreeMap<String, String>,
        pub tenants: BTreeMap<String, TenantRow>,
        pub ledger: BTreeMap<(String, u64, String), Entry>,
        pub cluster_events: BTreeMap<u64, ClusterEvent>,
    }

    impl Tables for MemTables {
        type Error = Infallible;

        fn route(&self, device: &str) -> Result<Option<Route>, Infallible> {
            Ok(self.routes.get(device).cloned())
        }
        fn put_route(&mut self, device: &str, route: &Route, replaces: Option<NodeId>) -> Result<(), Infallible> {
            if let Some(old) = replaces {
                self.node_routes.remove(&(old, device.to_string()));
            }
            self.routes.insert(device.to_string(), route.clone());
            self.node_routes.insert((route.node, device.to_string()));
            Ok(())
        }
        fn remove_route(&mut self, device: &str, node: NodeId) -> Result<(), Infallible> {
            self.routes.remove(device);
            self.node_routes.remove(&(node, device.to_string()));
            Ok(())
        }
        fn node_devices(&self, node: NodeId) -> Result<Vec<String>, Infallible> {
            let from = (node, String::new());
            Ok(self.node_routes.range(from..).take_while(|(n, _)| *n == node).map(|(_, d)| d.clone()).collect())
        }
        fn floor(&self, device: &str) -> Result<Option<Floor>, Infallible> {
            Ok(self.floors.get(device).cloned())
        }
        fn put_floor(&mut self, device: &str, floor: &Floor) -> Result<(), Infallible> {
            self.floors.insert(device.to_string(), floor.clone());
            Ok(())
        }
        fn head(&self, device: &str) -> Result<Option<Head>, Infallible> {
            Ok(self.heads.get(device).copied())
        }
        fn put_head(&mut self, device: &str, head: &Head) -> Result<(), Infallible> {
            self.heads.insert(device.to_string(), *head);
            Ok(())
        }
        fn message(&self, device: &str, seq: u64) -> Result<Option<Message>, Infallible> {
            Ok(self.messages.get(&(device.to_string(), seq)).cloned())
        }
        fn put_message(&mut self, device: &str, seq: u64, msg: &Message) -> Result<(), Infallible> {
            self.messages.insert((device.to_string(), seq), msg.clone());
            Ok(())
        }
        fn remove_message(&mut self, device: &str, seq: u64) -> Result<(), Infallible> {
            self.messages.remove(&(device.to_string(), seq));
            Ok(())
        }
        fn idempotent(&self, device: &str, key: &str) -> Result<Option<KeyUse>, Infallible> {
            Ok(self.idempotency.get(&(device.to_string(), key.to_string())).copied())
        }
        fn put_idempotent(&mut self, device: &str, key: &str, used: KeyUse) -> Result<(), Infallible> {
            self.idempotency.insert((device.to_string(), key.to_string()), used);
            self.key_order.insert((device.to_string(), used.at_ms, used.seq), key.to_string());
            Ok(())
        }
        fn remove_idempotent(&mut self, device: &str, key: &str, used: KeyUse) -> Result<(), Infallible> {
            self.idempotency.remove(&(device.to_string(), key.to_string()));
            self.key_order.remove(&(device.to_string(), used.at_ms, used.seq));
            Ok(())
        }
        fn oldest_key(&self, device: &str) -> Result<Option<(String, KeyUse)>, Infallible> {
            let from = (device.to_string(), 0, 0);
            let first = self.key_order.range(from..).next().filter(|((d, ..), _)| d == device);
            Ok(first.map(|((_, at_ms, seq), key)| (key.clone(), KeyUse { seq: *seq, at_ms: *at_ms })))
        }
        fn device_tenant(&self, device: &str) -> Result<Option<String>, Infallible> {
            Ok(self.device_tenants.get(device).cloned())
        }
        fn put_device_tenant(&mut self, device: &str, tenant: &str) -> Result<(), Infallible> {
            self.device_tenants.insert(device.to_string(), tenant.to_string());
            Ok(())
        }
        fn remove_device_tenant(&mut self, device: &str) -> Result<(), Infallible> {
            self.device_tenants.remove(device);
            Ok(())
        }
        fn tenant(&self, tenant: &str) -> Result<Option<TenantRow>, Infallible> {
            Ok(self.tenants.get(tenant).cloned())
        }
        fn put_tenant(&mut self, tenant: &str, row: &TenantRow) -> Result<(), Infallible> {
            self.tenants.insert(tenant.to_string(), row.clone());
            Ok(())
        }
        fn ledger(&self, tenant: &str, period: u64, id: &str) -> Result<Option<Entry>, Infallible> {
            Ok(self.ledger.get(&(tenant.to_string(), period, id.to_string())).copied())
        }
        fn put_ledger(&mut self, tenant: &str, period: u64, id: &str, entry: &Entry) -> Result<(), Infallible> {
            self.ledger.insert((tenant.to_string(), period, id.to_string()), *entry);
            Ok(())
        }
        fn prune_ledger(&mut self, tenant: &str, keep_from: u64) -> Result<(), Infallible> {
            self.ledger.retain(|(t, period, _), _| t != tenant || *period >= keep_from);
            Ok(())
        }
        fn put_cluster_event(&mut self, seq: u64, event: &ClusterEvent) -> Result<(), Infallible> {
            self.cluster_events.insert(seq, event.clone());
            Ok(())
        }
        fn remove_cluster_event(&mut self, seq: u64) -> Result<(), Infallible> {
            self.cluster_events.remove(&seq);
            Ok(())
        }
    }
}
