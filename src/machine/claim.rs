//! Claims and releases (V1, V2): a device's route moves only through a claim whose
//! `(epoch, attempt)` beats every claim accepted before, by a live member; floors are never
//! deleted, so a late claim stays fenced after its route is gone.

use serde::{Deserialize, Serialize};

use super::tenant::{admits_connection, count_route};
use super::types::{Floor, LeaseState, NodeId, Route, Superseded};
use super::{Apply, Ctx, Event, State, Tables};

/// Moves `device` to (`node`, `conn`) iff `(epoch, attempt)` beats the device's floor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub device: String,
    pub node: NodeId,
    pub conn: u64,
    pub epoch: u64,
    pub attempt: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimReply {
    /// The route is (node, conn) at `version`; `superseded` is the connection it replaced.
    Accepted {
        version: u64,
        superseded: Option<Superseded>,
        /// The device's stream head as this apply left it, answered only where a caller on the
        /// applying node waits for the claim (the leader's own proposals; see
        /// [`super::Ctx::local`]): its handshake announces it in `hello` without reading the
        /// stream again. Never on the wire (a forwarded reply carries `None`): a leader's head
        /// can be ahead of what the claiming follower has applied, and a `hello` must not
        /// announce what its own node cannot sync.
        #[serde(skip)]
        head: Option<u64>,
    },
    /// Not newer than the floor: nothing changed.
    Stale { floor_epoch: u64, floor_attempt: u64 },
    /// The claiming node holds no live lease (or is not a member): nothing changed.
    NodeNotLive,
    /// The device's tenant holds `limit` connections already: nothing changed.
    QuotaExhausted { limit: u64 },
}

impl Apply for Claim {
    type Reply = ClaimReply;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<ClaimReply, T::Error> {
        claim(cx, self, None)
    }
}

/// A claim by a device whose token names a tenant: counted against the tenant's connection cap
/// (a device that already holds a route of the same tenant takes no new slot).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimTenant {
    pub claim: Claim,
    pub tenant: String,
}

impl Apply for ClaimTenant {
    type Reply = ClaimReply;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<ClaimReply, T::Error> {
        claim(cx, &self.claim, Some(&self.tenant))
    }
}

fn claim<T: Tables>(cx: &mut Ctx<'_, T>, c: &Claim, tenant: Option<&String>) -> Result<ClaimReply, T::Error> {
    let &Claim { ref device, node, conn, epoch, attempt } = c;
    let claim = (epoch, attempt);
    let floor = cx.tables.floor(device)?;
    // Only an accepted claim writes a route or a device's tenant, and it writes the floor beside
    // them; floors are never deleted. So a device without a floor has neither: no reads for
    // them (every first claim of a device saves these B-tree lookups).
    let route = match floor {
        Some(_) => cx.tables.route(device)?,
        None => None,
    };
    if let Some(f) = &floor {
        if claim <= (f.max_epoch, f.max_attempt) {
            // A replayed claim (same conn, same attempt, still holding the route) is idempotent.
            if let Some(r) = route.as_ref().filter(|r| r.node == node && r.conn == conn) {
                if claim == (f.max_epoch, f.max_attempt) {
                    let head = local_head(cx, device, node, true)?;
                    return Ok(ClaimReply::Accepted { version: r.version, superseded: None, head });
                }
            }
            return Ok(ClaimReply::Stale { floor_epoch: f.max_epoch, floor_attempt: f.max_attempt });
        }
    }
    if cx.state.nodes.get(&node).map(|l| l.state) != Some(LeaseState::Live) || !cx.state.is_member(node) {
        return Ok(ClaimReply::NodeNotLive);
    }
    if let Some(t) = &tenant {
        let holds_slot = route.is_some() && cx.tables.device_tenant(device)?.as_ref() == Some(t);
        if !holds_slot {
            if let Err(limit) = admits_connection(cx.tables, t)? {
                return Ok(ClaimReply::QuotaExhausted { limit });
            }
        }
    }
    let version = floor.as_ref().map_or(0, |f| f.max_version) + 1;
    let superseded = match &route {
        Some(old) => {
            // The old route's row and index entry are overwritten or moved by `put_route`.
            uncount_tenant(cx.tables, device)?;
            if let Some(l) = cx.state.nodes.get_mut(&old.node) {
                l.routes = l.routes.saturating_sub(1);
            }
            cx.events.push(Event::Superseded { node: old.node, conn: old.conn });
            Some(Superseded { node: old.node, conn: old.conn })
        }
        None => None,
    };
    cx.tables.put_route(device, &Route { node, conn, version }, route.map(|r| r.node))?;
    if let Some(l) = cx.state.nodes.get_mut(&node) {
        l.routes += 1;
    }
    match &tenant {
        Some(t) => {
            count_route(cx.tables, t, 1)?;
            cx.tables.put_device_tenant(device, t)?;
        }
        // Without a floor there is no tenant row to delete (see above).
        None if floor.is_some() => cx.tables.remove_device_tenant(device)?,
        None => {}
    }
    let had_floor = floor.is_some();
    let floor = Floor { max_version: version, max_epoch: epoch, max_attempt: attempt, last_node: node };
    cx.tables.put_floor(device, &floor)?;
    let head = local_head(cx, device, node, had_floor)?;
    Ok(ClaimReply::Accepted { version, superseded, head })
}

/// The stream head to answer a claim by `node` with: only where `node` applies its own claim.
/// Publishing needs a floor, so a device that had none has no stream yet: head 0, no read.
fn local_head<T: Tables>(
    cx: &Ctx<'_, T>,
    device: &str,
    node: NodeId,
    had_floor: bool,
) -> Result<Option<u64>, T::Error> {
    if cx.local != Some(node) {
        return Ok(None);
    }
    if !had_floor {
        return Ok(Some(0));
    }
    Ok(Some(cx.tables.head(device)?.map_or(0, |h| h.head)))
}

/// Deletes the device's route only if it still names `conn`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub device: String,
    pub conn: u64,
}

impl Apply for Release {
    type Reply = bool;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<bool, T::Error> {
        match cx.tables.route(&self.device)? {
            Some(r) if r.conn == self.conn => {
                remove_route(cx.state, cx.tables, &self.device, &r)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

fn remove_route<T: Tables>(state: &mut State, tables: &mut T, device: &str, r: &Route) -> Result<(), T::Error> {
    tables.remove_route(device, r.node)?;
    uncount_tenant(tables, device)?;
    if let Some(l) = state.nodes.get_mut(&r.node) {
        l.routes = l.routes.saturating_sub(1);
    }
    Ok(())
}

/// Deletes every route naming `node`; floors stay, so late claims remain fenced.
pub(super) fn delete_node_routes<T: Tables>(state: &mut State, tables: &mut T, node: NodeId) -> Result<u64, T::Error> {
    let devices = tables.node_devices(node)?;
    for device in &devices {
        tables.remove_route(device, node)?;
        uncount_tenant(tables, device)?;
    }
    if let Some(l) = state.nodes.get_mut(&node) {
        l.routes = 0;
    }
    Ok(devices.len() as u64)
}

/// A route of `device` is gone: one connection fewer for its tenant, if it has one.
fn uncount_tenant<T: Tables>(tables: &mut T, device: &str) -> Result<(), T::Error> {
    match tables.device_tenant(device)? {
        Some(t) => count_route(tables, &t, -1),
        None => Ok(()),
    }
}
