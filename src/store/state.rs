//! `state.redb`: the applied state machine — routes, route floors, the node → device index, node
//! leases, meta (last applied, membership, ring version, cluster id) and the last built snapshot.
//! `apply` is deterministic: it reads no clock and no config, only the entries it is given.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::streams::{self, Delivery, Head, Message, Publish, StreamRead, StreamTables};
use super::StoreError;
use crate::codec::{decode, encode};
use crate::raft::types::{
    Command, Entry, Floor, LeaseState, LogId, NodeId, NodeLease, Reply, Response, Route, SnapshotMeta,
    StoredMembership, Superseded,
};

const ROUTES: TableDefinition<&str, &[u8]> = TableDefinition::new("routes");
const FLOORS: TableDefinition<&str, &[u8]> = TableDefinition::new("route_floor");
/// (node, device) for every route, so a sweep deletes a node's routes without a full scan.
const NODE_ROUTES: TableDefinition<(u64, &str), ()> = TableDefinition::new("node_routes");
const NODES: TableDefinition<u64, &[u8]> = TableDefinition::new("nodes");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");

const LAST_APPLIED: &str = "last_applied";
const MEMBERSHIP: &str = "membership";
const RING_VERSION: &str = "ring_version";
const CLUSTER_ID: &str = "cluster_id";
const CURRENT_SNAPSHOT: &str = "current";

/// The small part of the state every node needs on every decision, mirrored in memory after each
/// commit (the big tables stay in redb).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub ring_version: u64,
    pub cluster_id: Option<String>,
    pub nodes: BTreeMap<NodeId, NodeLease>,
}

impl Meta {
    fn is_member(&self, node: NodeId) -> bool {
        self.membership.membership().nodes().any(|(id, _)| *id == node)
    }

    fn live_set(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(id, l)| l.state == LeaseState::Live && self.is_member(**id))
            .map(|(id, _)| *id)
            .collect()
    }
}

/// Everything a snapshot carries besides its meta (last applied and membership live in the meta).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SnapshotBody {
    pub cluster_id: Option<String>,
    pub ring_version: u64,
    pub nodes: Vec<(NodeId, NodeLease)>,
    pub routes: Vec<(String, Route)>,
    pub floors: Vec<(String, Floor)>,
    pub heads: Vec<(String, Head)>,
    pub messages: Vec<(String, u64, Message)>,
    pub idempotency: Vec<(String, String, u64)>,
}

/// Handle on `state.redb`. Cheap to clone.
#[derive(Clone)]
pub struct StateDb {
    db: Arc<Database>,
}

impl StateDb {
    /// Opens (or creates) `state.redb` in `dir` and creates every table once.
    pub fn open(dir: &Path) -> Result<(StateDb, Meta), StoreError> {
        let db = Database::create(dir.join("state.redb"))?;
        let txn = db.begin_write()?;
        for t in [ROUTES, FLOORS, META, SNAPSHOT] {
            txn.open_table(t)?;
        }
        txn.open_table(NODE_ROUTES)?;
        txn.open_table(NODES)?;
        txn.open_table(streams::STREAMS)?;
        txn.open_table(streams::HEADS)?;
        txn.open_table(streams::IDEMPOTENCY)?;
        txn.commit()?;
        let db = StateDb { db: Arc::new(db) };
        let meta = db.load_meta()?;
        Ok((db, meta))
    }

    fn load_meta(&self) -> Result<Meta, StoreError> {
        let txn = self.db.begin_read()?;
        let meta = txn.open_table(META)?;
        let get = |k: &str| -> Result<Option<Vec<u8>>, StoreError> { Ok(meta.get(k)?.map(|v| v.value().to_vec())) };
        let mut out = Meta::default();
        if let Some(b) = get(LAST_APPLIED)? {
            out.last_applied = decode(&b)?;
        }
        if let Some(b) = get(MEMBERSHIP)? {
            out.membership = decode(&b)?;
        }
        if let Some(b) = get(RING_VERSION)? {
            out.ring_version = decode(&b)?;
        }
        if let Some(b) = get(CLUSTER_ID)? {
            out.cluster_id = decode(&b)?;
        }
        let nodes = txn.open_table(NODES)?;
        for row in nodes.iter()? {
            let (k, v) = row?;
            out.nodes.insert(k.value(), decode(v.value())?);
        }
        Ok(out)
    }

    /// Applies `entries` in one transaction and returns one response per entry plus the new meta.
    /// The commit is not fsynced: `last_applied` rides in the same transaction, so a crash replays
    /// from the log; snapshots commit durably (see [`StateDb::save_snapshot`]).
    pub fn apply(&self, meta: &Meta, entries: Vec<Entry>) -> Result<(Vec<Response>, Meta), StoreError> {
        self.apply_with(meta, entries, &mut Vec::new())
    }

    /// [`StateDb::apply`], also collecting the messages to push to connections (`deliveries`).
    pub fn apply_with(
        &self,
        meta: &Meta,
        entries: Vec<Entry>,
        deliveries: &mut Vec<Delivery>,
    ) -> Result<(Vec<Response>, Meta), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::None)?;
        let mut meta = meta.clone();
        let mut out = Vec::with_capacity(entries.len());
        let mut dirty_nodes = Vec::new();
        {
            let mut t = Tables::open(&txn)?;
            for entry in entries {
                let live_before = meta.live_set();
                let resp = match entry.payload {
                    openraft::EntryPayload::Blank => Response::default(),
                    openraft::EntryPayload::Membership(m) => {
                        meta.membership = StoredMembership::new(Some(entry.log_id), m);
                        Response::default()
                    }
                    openraft::EntryPayload::Normal(req) => {
                        let mut replies = Vec::with_capacity(req.cmds.len());
                        for cmd in req.cmds {
                            replies.push(t.apply(&mut meta, cmd, &mut dirty_nodes, deliveries)?);
                        }
                        Response { replies }
                    }
                };
                if meta.live_set() != live_before {
                    meta.ring_version = entry.log_id.index;
                }
                meta.last_applied = Some(entry.log_id);
                out.push(resp);
            }
            dirty_nodes.sort_unstable();
            dirty_nodes.dedup();
            for id in dirty_nodes {
                match meta.nodes.get(&id) {
                    Some(lease) => t.nodes.insert(id, encode(lease)?.as_slice())?,
                    None => t.nodes.remove(id)?,
                };
            }
            write_meta(&mut t.meta, &meta)?;
        }
        txn.commit()?;
        Ok((out, meta))
    }

    /// A device's stream bounds and up to `limit` retained messages after `after`.
    pub fn stream(&self, device: &str, after: u64, limit: usize) -> Result<StreamRead, StoreError> {
        let txn = self.db.begin_read()?;
        streams::read(&txn.open_table(streams::STREAMS)?, &txn.open_table(streams::HEADS)?, device, after, limit)
    }

    pub fn route(&self, device: &str) -> Result<(Option<Route>, Option<Floor>), StoreError> {
        let txn = self.db.begin_read()?;
        let route = txn.open_table(ROUTES)?.get(device)?.map(|v| decode(v.value())).transpose()?;
        let floor = txn.open_table(FLOORS)?.get(device)?.map(|v| decode(v.value())).transpose()?;
        Ok((route, floor))
    }

    /// Serializes the whole state from one read transaction (applies may run concurrently). The
    /// returned `Meta` carries only `last_applied` and `membership` (what a snapshot's meta needs);
    /// everything else is in the body.
    pub fn dump(&self) -> Result<(Meta, SnapshotBody), StoreError> {
        let txn = self.db.begin_read()?;
        let meta_t = txn.open_table(META)?;
        let mut meta = Meta::default();
        if let Some(v) = meta_t.get(LAST_APPLIED)? {
            meta.last_applied = decode(v.value())?;
        }
        if let Some(v) = meta_t.get(MEMBERSHIP)? {
            meta.membership = decode(v.value())?;
        }
        let mut body = SnapshotBody::default();
        if let Some(v) = meta_t.get(RING_VERSION)? {
            body.ring_version = decode(v.value())?;
        }
        if let Some(v) = meta_t.get(CLUSTER_ID)? {
            body.cluster_id = decode(v.value())?;
        }
        for row in txn.open_table(NODES)?.iter()? {
            let (k, v) = row?;
            body.nodes.push((k.value(), decode(v.value())?));
        }
        for row in txn.open_table(ROUTES)?.iter()? {
            let (k, v) = row?;
            body.routes.push((k.value().to_string(), decode(v.value())?));
        }
        for row in txn.open_table(FLOORS)?.iter()? {
            let (k, v) = row?;
            body.floors.push((k.value().to_string(), decode(v.value())?));
        }
        for row in txn.open_table(streams::HEADS)?.iter()? {
            let (k, v) = row?;
            body.heads.push((k.value().to_string(), decode(v.value())?));
        }
        for row in txn.open_table(streams::STREAMS)?.iter()? {
            let (k, v) = row?;
            let (device, seq) = k.value();
            body.messages.push((device.to_string(), seq, decode(v.value())?));
        }
        for row in txn.open_table(streams::IDEMPOTENCY)?.iter()? {
            let (k, v) = row?;
            let (device, key) = k.value();
            body.idempotency.push((device.to_string(), key.to_string(), v.value()));
        }
        Ok((meta, body))
    }

    /// Stores the last built snapshot durably. The `Immediate` commit also makes every earlier
    /// non-durable apply durable, so the state on disk is at least as new as any snapshot that lets
    /// openraft purge the log.
    pub fn save_snapshot(&self, meta: &SnapshotMeta, data: &[u8]) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut t = txn.open_table(SNAPSHOT)?;
            // A build runs beside applies and installs: never replace a newer snapshot (an
            // install may have stored one while this build was dumping).
            let stored = t.get(CURRENT_SNAPSHOT)?.map(|v| decode::<(SnapshotMeta, Vec<u8>)>(v.value())).transpose()?;
            if stored.is_none_or(|(m, _)| m.last_log_id < meta.last_log_id) {
                t.insert(CURRENT_SNAPSHOT, encode(&(meta, data))?.as_slice())?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    pub fn load_snapshot(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StoreError> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(SNAPSHOT)?;
        let v = t.get(CURRENT_SNAPSHOT)?;
        Ok(v.map(|v| decode(v.value())).transpose()?)
    }

    /// Replaces the whole state with a snapshot's, durably, in one transaction.
    pub fn install(&self, smeta: &SnapshotMeta, data: &[u8]) -> Result<Meta, StoreError> {
        let body: SnapshotBody = decode(data)?;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        for t in [ROUTES, FLOORS, META] {
            txn.delete_table(t)?;
        }
        txn.delete_table(NODE_ROUTES)?;
        txn.delete_table(NODES)?;
        txn.delete_table(streams::STREAMS)?;
        txn.delete_table(streams::HEADS)?;
        txn.delete_table(streams::IDEMPOTENCY)?;
        let meta = Meta {
            last_applied: smeta.last_log_id,
            membership: smeta.last_membership.clone(),
            ring_version: body.ring_version,
            cluster_id: body.cluster_id.clone(),
            nodes: body.nodes.iter().cloned().collect(),
        };
        {
            let mut t = Tables::open(&txn)?;
            for (id, lease) in &body.nodes {
                t.nodes.insert(*id, encode(lease)?.as_slice())?;
            }
            for (device, route) in &body.routes {
                t.routes.insert(device.as_str(), encode(route)?.as_slice())?;
                t.node_routes.insert((route.node, device.as_str()), ())?;
            }
            for (device, floor) in &body.floors {
                t.floors.insert(device.as_str(), encode(floor)?.as_slice())?;
            }

            write_meta(&mut t.meta, &meta)?;
            txn.open_table(SNAPSHOT)?.insert(CURRENT_SNAPSHOT, encode(&(smeta, data))?.as_slice())?;
        }
        {
            let mut heads = txn.open_table(streams::HEADS)?;
            for (device, head) in &body.heads {
                heads.insert(device.as_str(), encode(head)?.as_slice())?;
            }
            let mut messages = txn.open_table(streams::STREAMS)?;
            for (device, seq, msg) in &body.messages {
                messages.insert((device.as_str(), *seq), encode(msg)?.as_slice())?;
            }
            let mut idem = txn.open_table(streams::IDEMPOTENCY)?;
            for (device, key, seq) in &body.idempotency {
                idem.insert((device.as_str(), key.as_str()), *seq)?;
            }
        }
        txn.commit()?;
        Ok(meta)
    }
}

fn write_meta(t: &mut redb::Table<&str, &[u8]>, meta: &Meta) -> Result<(), StoreError> {
    t.insert(LAST_APPLIED, encode(&meta.last_applied)?.as_slice())?;
    t.insert(MEMBERSHIP, encode(&meta.membership)?.as_slice())?;
    t.insert(RING_VERSION, encode(&meta.ring_version)?.as_slice())?;
    t.insert(CLUSTER_ID, encode(&meta.cluster_id)?.as_slice())?;
    Ok(())
}

/// The tables one apply transaction touches, opened once per transaction.
struct Tables<'t> {
    routes: redb::Table<'t, &'static str, &'static [u8]>,
    floors: redb::Table<'t, &'static str, &'static [u8]>,
    node_routes: redb::Table<'t, (u64, &'static str), ()>,
    nodes: redb::Table<'t, u64, &'static [u8]>,
    meta: redb::Table<'t, &'static str, &'static [u8]>,
    streams: StreamTables<'t>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<Self, StoreError> {
        Ok(Tables {
            routes: txn.open_table(ROUTES)?,
            floors: txn.open_table(FLOORS)?,
            node_routes: txn.open_table(NODE_ROUTES)?,
            nodes: txn.open_table(NODES)?,
            meta: txn.open_table(META)?,
            streams: StreamTables::open(txn)?,
        })
    }

    fn apply(
        &mut self,
        meta: &mut Meta,
        cmd: Command,
        dirty: &mut Vec<NodeId>,
        deliveries: &mut Vec<Delivery>,
    ) -> Result<Reply, StoreError> {
        Ok(match cmd {
            Command::Init { cluster_id } => {
                if meta.cluster_id.is_none() {
                    meta.cluster_id = Some(cluster_id);
                }
                Reply::Done
            }
            Command::Claim { device, node, conn, epoch, attempt } => {
                self.claim(meta, &device, node, conn, (epoch, attempt), dirty)?
            }
            Command::Release { device, conn } => {
                let route: Option<Route> = self.routes.get(device.as_str())?.map(|v| decode(v.value())).transpose()?;
                match route {
                    Some(r) if r.conn == conn => {
                        self.remove_route(meta, &device, &r, dirty)?;
                        Reply::Released(true)
                    }
                    _ => Reply::Released(false),
                }
            }
            Command::Renew { node, at_ms, lease_ms, connections, draining, incarnation } => {
                if meta.is_member(node) {
                    let lease = meta.nodes.entry(node).or_insert(NodeLease {
                        lease_until_ms: 0,
                        state: LeaseState::Live,
                        connections: 0,
                        routes: 0,
                        incarnation,
                    });
                    lease.lease_until_ms = lease.lease_until_ms.max(at_ms.saturating_add(lease_ms));
                    let same_process = lease.incarnation == incarnation;
                    lease.state = match lease.state {
                        _ if draining => LeaseState::Draining,
                        LeaseState::Draining if same_process => LeaseState::Draining,
                        _ => LeaseState::Live,
                    };
                    lease.incarnation = incarnation;
                    lease.connections = connections;
                    dirty.push(node);
                }
                Reply::Done
            }
            Command::Sweep { at_ms, grace_ms, candidates } => {
                let mut expired = Vec::new();
                let mut routes_deleted = 0;
                for node in candidates {
                    let lapsed = meta.nodes.get(&node).is_some_and(|l| {
                        l.state != LeaseState::Expired && l.lease_until_ms.saturating_add(grace_ms) < at_ms
                    });
                    if lapsed {
                        routes_deleted += self.delete_node_routes(meta, node, dirty)?;
                        if let Some(l) = meta.nodes.get_mut(&node) {
                            l.state = LeaseState::Expired;
                        }
                        dirty.push(node);
                        expired.push(node);
                    }
                }
                Reply::Swept { expired, routes_deleted }
            }
            Command::ExtendLeases { at_ms, lease_ms } => {
                for (id, l) in meta.nodes.iter_mut() {
                    if l.state != LeaseState::Expired {
                        l.lease_until_ms = l.lease_until_ms.max(at_ms.saturating_add(lease_ms));
                        dirty.push(*id);
                    }
                }
                Reply::Done
            }
            Command::Drain { node, at_ms: _ } => match meta.nodes.get_mut(&node) {
                Some(l) if l.state == LeaseState::Live => {
                    l.state = LeaseState::Draining;
                    dirty.push(node);
                    Reply::Count(1)
                }
                _ => Reply::Count(0),
            },
            Command::ReleaseNode { node } => Reply::Count(self.delete_node_routes(meta, node, dirty)?),
            Command::Publish { device, payload, key, at_ms, keep_count, keep_age_ms } => {
                if self.floors.get(device.as_str())?.is_none() {
                    return Ok(Reply::NoSuchDevice);
                }
                let text = payload.clone();
                let p = Publish { device: &device, payload, key, at_ms, keep_count, keep_age_ms };
                let reply = self.streams.publish(p)?;
                if let Reply::Published { seq, duplicate: false } = reply {
                    let route: Option<Route> =
                        self.routes.get(device.as_str())?.map(|v| decode(v.value())).transpose()?;
                    if let Some(r) = route {
                        deliveries.push(Delivery { node: r.node, conn: r.conn, device, seq, payload: text });
                    }
                }
                reply
            }
            Command::Ack { device, seq } => self.streams.ack(&device, seq)?,
            Command::Forget { node } => {
                let n = self.delete_node_routes(meta, node, dirty)?;
                meta.nodes.remove(&node);
                dirty.push(node);
                Reply::Count(n)
            }
        })
    }

    fn claim(
        &mut self,
        meta: &mut Meta,
        device: &str,
        node: NodeId,
        conn: u64,
        claim: (u64, u64),
        dirty: &mut Vec<NodeId>,
    ) -> Result<Reply, StoreError> {
        let floor: Option<Floor> = self.floors.get(device)?.map(|v| decode(v.value())).transpose()?;
        let route: Option<Route> = self.routes.get(device)?.map(|v| decode(v.value())).transpose()?;
        if let Some(f) = &floor {
            if claim <= (f.max_epoch, f.max_attempt) {
                // A replayed claim (same conn, same attempt, still holding the route) is idempotent.
                if let Some(r) = route.as_ref().filter(|r| r.node == node && r.conn == conn) {
                    if claim == (f.max_epoch, f.max_attempt) {
                        return Ok(Reply::Accepted { version: r.version, superseded: None });
                    }
                }
                return Ok(Reply::Stale { floor_epoch: f.max_epoch, floor_attempt: f.max_attempt });
            }
        }
        if meta.nodes.get(&node).map(|l| l.state) != Some(LeaseState::Live) || !meta.is_member(node) {
            return Ok(Reply::NodeNotLive);
        }
        let version = floor.as_ref().map_or(0, |f| f.max_version) + 1;
        let superseded = match &route {
            Some(old) => {
                self.remove_route(meta, device, old, dirty)?;
                Some(Superseded { node: old.node, conn: old.conn })
            }
            None => None,
        };
        let new = Route { node, conn, version };
        self.routes.insert(device, encode(&new)?.as_slice())?;
        self.node_routes.insert((node, device), ())?;
        if let Some(l) = meta.nodes.get_mut(&node) {
            l.routes += 1;
        }
        dirty.push(node);
        let floor = Floor { max_version: version, max_epoch: claim.0, max_attempt: claim.1, last_node: node };
        self.floors.insert(device, encode(&floor)?.as_slice())?;
        Ok(Reply::Accepted { version, superseded })
    }

    fn remove_route(
        &mut self,
        meta: &mut Meta,
        device: &str,
        r: &Route,
        dirty: &mut Vec<NodeId>,
    ) -> Result<(), StoreError> {
        self.routes.remove(device)?;
        self.node_routes.remove((r.node, device))?;
        if let Some(l) = meta.nodes.get_mut(&r.node) {
            l.routes = l.routes.saturating_sub(1);
            dirty.push(r.node);
        }
        Ok(())
    }

    /// Deletes every route naming `node`; floors stay, so late claims remain fenced.
    fn delete_node_routes(
        &mut self,
        meta: &mut Meta,
        node: NodeId,
        dirty: &mut Vec<NodeId>,
    ) -> Result<u64, StoreError> {
        let mut devices = Vec::new();
        for row in self.node_routes.range((node, "")..)? {
            let (k, _) = row?;
            let (n, device) = k.value();
            if n != node {
                break;
            }
            devices.push(device.to_string());
        }
        for device in &devices {
            self.routes.remove(device.as_str())?;
            self.node_routes.remove((node, device.as_str()))?;
        }
        if let Some(l) = meta.nodes.get_mut(&node) {
            l.routes = 0;
            dirty.push(node);
        }
        Ok(devices.len() as u64)
    }
}
