//! Placement (design §2): where a device should connect. Its current route's node if that node is
//! live; else the node of its last accepted claim if live; else the ring owner, skipping nodes
//! whose connection count exceeds 1.3 × the live mean — for a device never placed before (no
//! route, no floor), the less loaded of the owner and the next node on the ring. Never a node
//! whose lease has lapsed, never a `fallback` node (one the device reported unreachable, or a full
//! node that sent it on), and never a node whose renewed count has reached the connection limit
//! it published ([`is_full`]) except for the device's own current route. Pure over its inputs:
//! the counts are the applied ones (they travel with lease renewals), so every node places a
//! device alike.
//!
//! Two choices (issue 15): a node that just joined first takes every new device while the others
//! hold more than 1.3 × the mean (the overlay); after that, with the owner alone, it would fill at
//! only 1/N of arrivals. As one of two candidates it takes about 2/N of them until its count (as
//! renewed) reaches the others'. Connected and reconnecting devices never move (steps one and
//! two), and a device whose node died goes to the owner its `hello` named ([`successor`]): the
//! loads have changed since, and a second choice would redirect most of a storm.

use crate::machine::{Floor, LeaseState, NodeId, Route};
use crate::view::ClusterView;

/// Load overlay factor: a node above this multiple of the mean is skipped by the ring step.
pub const OVERLOAD: f64 = 1.3;

/// Whether `id` may receive devices: a member, applied state live, and its lease not lapsed at `now_ms`.
pub fn is_live(view: &ClusterView, id: NodeId, now_ms: u64) -> bool {
    view.member(id).is_some()
        && view.lease(id).is_some_and(|l| l.state == LeaseState::Live && l.lease_until_ms > now_ms)
}

/// Whether `id`'s renewed connection count has reached the limit it published
/// (`--max-connections`): it would refuse a new device with `503 at_capacity`. The count is as of
/// its last renewal (lease/5 ago at most); a node that fills in between sends devices on itself.
pub fn is_full(view: &ClusterView, id: NodeId) -> bool {
    let limit = view.state.max_connections.get(&id).copied();
    limit.is_some_and(|limit| view.lease(id).is_some_and(|l| l.connections >= limit))
}

/// The node `device` should connect to, or None if no node is live and below its limit. Its
/// current route's node is kept even when full: the device holds one of its connections.
///
/// `dialled`: for a device that names nodes in `exclude` (it lost its node, or a full node sent
/// it on), the node it dialled, which is where its `hello` (or the full node) sent it under the
/// loads of then. The ring step keeps it there while that node is still one the ring step could
/// choose now (live, not full, not above [`OVERLOAD`] × the mean) instead of spending a redirect,
/// and a token of the storm's admission budget, on how the loads moved since: a hello's
/// successor is computed when the device connects, and a count above the overlay then (the
/// counts lag a renewal behind a filling cluster) sent 5-18 % of a dead node's devices to a node
/// that placement then sent them on from, in a measured storm.
pub fn place(
    view: &ClusterView,
    device: &str,
    route: Option<&Route>,
    floor: Option<&Floor>,
    exclude: &[NodeId],
    dialled: Option<NodeId>,
    now_ms: u64,
) -> Option<NodeId> {
    let ok = |id: NodeId| !exclude.contains(&id) && is_live(view, id, now_ms);
    if let Some(r) = route.filter(|r| ok(r.node)) {
        return Some(r.node);
    }
    if let Some(f) = floor.filter(|f| ok(f.last_node) && !is_full(view, f.last_node)) {
        return Some(f.last_node);
    }
    // Two choices only for a device never placed before: one whose node died goes where its
    // `hello` said it would (`successor`), so a storm costs no redirects.
    ring_step(view, device, ok, route.is_none() && floor.is_none(), dialled)
}

/// Where a device connected to `me` goes if `me` fails: the ring step without `me` and without
/// the two choices, which is what [`place`] answers for it then (its floor names `me`). The
/// `hello` tells the device (`next_url`) so that it dials there directly.
pub fn successor(view: &ClusterView, device: &str, me: NodeId, now_ms: u64) -> Option<NodeId> {
    ring_step(view, device, |id| id != me && is_live(view, id, now_ms), false, None)
}

/// The ring owner among the nodes `ok` accepts, skipping full ones and, while another qualifies,
/// those above [`OVERLOAD`] × the mean; with `two_choices`, the less loaded of the owner and the
/// next node on the ring. `stay`, when it qualifies as such an owner would, is kept instead.
fn ring_step(
    view: &ClusterView,
    device: &str,
    ok: impl Fn(NodeId) -> bool,
    two_choices: bool,
    stay: Option<NodeId>,
) -> Option<NodeId> {
    let live: Vec<(NodeId, u64)> = view
        .members()
        .filter(|(id, _)| ok(*id))
        .map(|(id, _)| (id, view.lease(id).map_or(0, |l| l.connections)))
        .collect();
    if live.is_empty() {
        return None;
    }
    let mean = live.iter().map(|(_, c)| *c as f64).sum::<f64>() / live.len() as f64;
    let id_of = |name: &str| view.id_of_name(name);
    let usable = |name: &str, overlay: bool| {
        id_of(name).is_some_and(|id| {
            !is_full(view, id)
                && live.iter().any(|(l, c)| *l == id && (!overlay || mean == 0.0 || (*c as f64) <= OVERLOAD * mean))
        })
    };
    if let Some(stay) = stay.filter(|id| view.member(*id).is_some_and(|m| usable(&m.name, true))) {
        return Some(stay);
    }
    let key = device.as_bytes();
    let owner = view.ring.owner_skipping(key, |name| !usable(name, true));
    let Some(owner) = owner else {
        return view.ring.owner_skipping(key, |name| !usable(name, false)).and_then(id_of);
    };
    if !two_choices {
        return id_of(owner);
    }
    let count = |name: &str| id_of(name).and_then(|id| live.iter().find(|(l, _)| *l == id)).map_or(0, |(_, c)| *c);
    let second = view.ring.owner_skipping(key, |name| name == owner || !usable(name, true));
    match second {
        Some(second) if count(second) < count(owner) => id_of(second),
        _ => id_of(owner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Member, NodeLease, State};
    use std::collections::BTreeMap;

    fn view(leases: &[(NodeId, LeaseState, u64, u64)]) -> ClusterView {
        let nodes: BTreeMap<NodeId, Member> = leases
            .iter()
            .map(|(id, ..)| {
                (
                    *id,
                    Member {
                        name: format!("n{id}").into(),
                        cluster_addr: format!("a{id}").into(),
                        public_url: String::new().into(),
                    },
                )
            })
            .collect();
        let mut s = State { voters: nodes.keys().copied().collect(), members: nodes, ..Default::default() };
        for (id, state, until, conns) in leases {
            s.nodes.insert(
                *id,
                NodeLease {
                    lease_until_ms: *until,
                    state: *state,
                    connections: *conns,
                    routes: 0,
                    incarnation: 0,
                    extendable: true,
                    suspect_until_ms: 0,
                },
            );
        }
        ClusterView::new(s, None)
    }

    const NOW: u64 = 1_000;

    #[test]
    fn route_then_floor_then_ring() {
        let v =
            view(&[(1, LeaseState::Live, 5_000, 0), (2, LeaseState::Live, 5_000, 0), (3, LeaseState::Live, 5_000, 0)]);
        let route = Route { node: 2, conn: 1, version: 1 };
        let floor = Floor { max_version: 1, max_epoch: 0, max_attempt: 1, last_node: 3 };
        assert_eq!(place(&v, "d", Some(&route), Some(&floor), &[], None, NOW), Some(2));
        assert_eq!(place(&v, "d", None, Some(&floor), &[], None, NOW), Some(3));
        let owner = place(&v, "d", None, None, &[], None, NOW).unwrap();
        assert_eq!(&*v.member(owner).unwrap().name, v.ring.owner(b"d").unwrap());
        // The reported-unreachable node is never chosen.
        assert_ne!(place(&v, "d", Some(&route), None, &[2], None, NOW), Some(2));
    }

    #[test]
    fn never_a_lapsed_draining_or_expired_node() {
        let v = view(&[
            (1, LeaseState::Live, 500, 0),
            (2, LeaseState::Draining, 5_000, 0),
            (3, LeaseState::Expired, 5_000, 0),
        ]);
        let route = Route { node: 1, conn: 1, version: 1 };
        assert_eq!(place(&v, "d", Some(&route), None, &[], None, NOW), None, "lease of n1 lapsed at 500 < now");
        let v = view(&[(1, LeaseState::Live, 5_000, 0), (2, LeaseState::Draining, 5_000, 0)]);
        for d in 0..50 {
            assert_eq!(place(&v, &format!("d{d}"), None, None, &[], None, NOW), Some(1));
        }
    }

    #[test]
    fn a_fresh_node_takes_about_two_shares_of_new_devices_until_it_catches_up() {
        let devices = 2_000;
        let on = |v: &ClusterView, node: NodeId| {
            (0..devices).filter(|d| place(v, &format!("dev{d}"), None, None, &[], None, NOW) == Some(node)).count()
        };
        let live = |id, conns| (id, LeaseState::Live, 5_000, conns);
        // n4 joined a while ago and holds 40: nobody is above 1.3x the mean (85), so the overlay
        // skips nobody and only the two choices steer.
        let fresh = view(&[live(1, 100), live(2, 100), live(3, 100), live(4, 40)]);
        let balanced = view(&[live(1, 100), live(2, 100), live(3, 100), live(4, 100)]);
        let ring_share = on(&balanced, 4);
        let steered = on(&fresh, 4);
        assert!((350..650).contains(&ring_share), "owner only at equal load: ~1/4, got {ring_share}");
        assert!(steered > ring_share * 3 / 2, "fresh n4 takes ~2/4 of new devices: {steered} vs {ring_share}");
        assert!(steered < devices * 2 / 3, "and not all of them: {steered}");
        // Just joined (0 while the others hold 100: all above 1.3x the mean of 75): the overlay
        // sends every new device to it until it holds a few.
        let empty = view(&[live(1, 100), live(2, 100), live(3, 100), live(4, 0)]);
        assert_eq!(on(&empty, 4), devices);
        // A device that was here before goes back to its node, whatever the loads.
        let floor = Floor { max_version: 1, max_epoch: 0, max_attempt: 1, last_node: 2 };
        assert_eq!(place(&fresh, "dev1", None, Some(&floor), &[], None, NOW), Some(2));
        // One whose node died goes where its hello said (`successor`, told while n2 lived),
        // whatever the loads did since: no redirect in the storm.
        let died = |loads: &[(NodeId, u64)]| {
            let mut l: Vec<_> = loads.iter().map(|(id, c)| live(*id, *c)).collect();
            l.push((2, LeaseState::Expired, 5_000, 0));
            view(&l)
        };
        for d in 0..devices {
            let dev = format!("dev{d}");
            let told = successor(&fresh, &dev, 2, NOW);
            let floor = Floor { last_node: 2, ..floor };
            for after in [died(&[(1, 100), (3, 100), (4, 40)]), died(&[(1, 100), (3, 60), (4, 95)])] {
                assert_eq!(place(&after, &dev, None, Some(&floor), &[], None, NOW), told, "{dev}");
            }
        }
        // Deterministic: the same view places a device the same way every time.
        assert_eq!(
            place(&fresh, "dev7", None, None, &[], None, NOW),
            place(&fresh, "dev7", None, None, &[], None, NOW)
        );
    }

    #[test]
    fn overloaded_nodes_are_skipped_by_the_ring_step() {
        // n1 holds far more than 1.3x the mean: no new device lands there while others are fine.
        let v = view(&[
            (1, LeaseState::Live, 5_000, 1000),
            (2, LeaseState::Live, 5_000, 10),
            (3, LeaseState::Live, 5_000, 10),
        ]);
        for d in 0..200 {
            assert_ne!(place(&v, &format!("d{d}"), None, None, &[], None, NOW), Some(1));
        }
    }

    #[test]
    fn a_node_at_its_published_limit_gets_no_new_device_but_keeps_its_own() {
        // Run 5 of the 57k fleet: the survivor owning the biggest ring share was at its
        // --max-connections while nobody was above 1.3x the mean (1,183 here).
        let live = |id, conns| (id, LeaseState::Live, 5_000, conns);
        let mut v = view(&[live(1, 1000), live(2, 950), live(3, 780), (4, LeaseState::Expired, 5_000, 0)]);
        let on_n1 = |v: &ClusterView| {
            (0..300).filter(|d| successor(v, &format!("d{d}"), 4, NOW) == Some(1)).collect::<Vec<_>>()
        };
        let owned = on_n1(&v);
        assert!(owned.len() > 50, "n1 owns about a third of the ring: {}", owned.len());
        let limits = |v: &mut ClusterView, l: &[(NodeId, u64)]| {
            std::sync::Arc::make_mut(&mut v.state).max_connections = l.iter().copied().collect()
        };
        limits(&mut v, &[(1, 1000), (2, 2000), (3, 2000)]);
        assert!(is_full(&v, 1) && !is_full(&v, 2));
        assert!(on_n1(&v).is_empty(), "the successor told in hello skips a full node");
        let floor = |last_node| Floor { max_version: 1, max_epoch: 0, max_attempt: 1, last_node };
        for d in &owned {
            let dev = format!("d{d}");
            // The dead node's devices, and devices whose last node is the full one, go elsewhere.
            assert!(matches!(place(&v, &dev, None, Some(&floor(4)), &[], None, NOW), Some(2 | 3)), "{dev}");
            assert!(matches!(place(&v, &dev, None, Some(&floor(1)), &[], None, NOW), Some(2 | 3)), "{dev}");
            assert!(matches!(place(&v, &dev, None, None, &[], None, NOW), Some(2 | 3)), "{dev}");
            // A device connected there stays (its reconnect supersedes its own connection).
            let route = Route { node: 1, conn: 1, version: 1 };
            assert_eq!(place(&v, &dev, Some(&route), Some(&floor(1)), &[], None, NOW), Some(1));
        }
        // One below its limit takes devices again; with every node full there is nowhere to go.
        limits(&mut v, &[(1, 1001), (2, 2000), (3, 2000)]);
        assert_eq!(on_n1(&v), owned);
        limits(&mut v, &[(1, 1000), (2, 950), (3, 780)]);
        assert_eq!(place(&v, "d1", None, Some(&floor(4)), &[], None, NOW), None);
    }
    #[test]
    fn a_device_whose_node_died_stays_where_it_was_sent_while_that_node_qualifies() {
        let live = |id, conns| (id, LeaseState::Live, 5_000, conns);
        // Told while the cluster filled: n1's count, a renewal ahead of n3's, was above 1.3x the
        // mean, so every hello on n2 named n3.
        let filling = view(&[live(1, 140), live(2, 100), live(3, 60)]);
        // The storm: n2 is gone but not yet out of the ring; the device names it.
        let storm = |n1, n3| view(&[live(1, n1), live(2, 1_000), live(3, n3)]);
        let floor = Floor { max_version: 1, max_epoch: 0, max_attempt: 1, last_node: 2 };
        let mut redirected_before = 0;
        for d in 0..1_000 {
            let dev = format!("dev{d}");
            let told = successor(&filling, &dev, 2, NOW);
            assert_eq!(told, Some(3), "{dev}");
            let now = storm(1_000, 1_000);
            assert_eq!(place(&now, &dev, None, Some(&floor), &[2], told, NOW), told, "{dev}");
            redirected_before += usize::from(place(&now, &dev, None, Some(&floor), &[2], None, NOW) != told);
            // Not where it dialled if that node is now above the overlay, or is the one it lost.
            assert_eq!(place(&storm(1_000, 3_000), &dev, None, Some(&floor), &[2], told, NOW), Some(1), "{dev}");
            assert_ne!(place(&now, &dev, None, Some(&floor), &[2], Some(2), NOW), Some(2), "{dev}");
        }
        assert!((300..700).contains(&redirected_before), "the loads of then cost {redirected_before} redirects");
    }
}
