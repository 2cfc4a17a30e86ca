//! Whether a stopping node still has a quorum to write through. A drain's two writes (`Drain`,
//! `ReleaseNode`) and its leader hand-over need one. When the members are stopped together
//! (`docker compose down`, a host shutdown) or one at a time with the leader last, the last node
//! standing has none: without this check it waited out the write timeout (`--propose-timeout-ms`)
//! for each write and a leader lease for the hand-over before it exited, 7–12 s with the defaults.
//! Its routes are then swept when its lease lapses, as a killed node's are (V6 by the lease).
//!
//! No quorum is left when the voters whose cluster port refuses connections (their process is
//! gone: [`super::detector::port_refuses`]) leave fewer than a majority, or, on a leader, when no
//! quorum has acknowledged it for a leader lease (a stopped container's address stops answering
//! instead of refusing). A paused or partitioned voter counts as there: its writes are waited for.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use super::detector::port_refuses;
use crate::cluster::Handle;
use crate::machine::NodeId;

/// What this node can reach of the voters, as probed once.
#[derive(Debug, Default)]
pub struct Reach {
    /// Voters other than this node whose cluster port refused a connection.
    pub gone: BTreeSet<NodeId>,
    /// Why no quorum is left, when none is.
    pub lost: Option<String>,
}

/// How often, and against what, a stopping node checks its quorum.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    /// Between probes, and each probe's bound: a heartbeat.
    pub every: Duration,
    /// openraft's leader lease (`election_timeout_max`).
    pub lease: Duration,
}

impl Check {
    /// Probes every other voter's cluster port at once (each allowed `every`).
    pub async fn reach(&self, cluster: &Handle) -> Reach {
        let me = cluster.me();
        let voters = cluster.voters();
        let probes = voters
            .iter()
            .filter(|(id, _)| *id != me)
            .map(|(id, addr)| async move { port_refuses(addr, self.every).await.then_some(*id) });
        let gone: BTreeSet<NodeId> = futures_util::future::join_all(probes).await.into_iter().flatten().collect();
        Reach { lost: lost(voters.len(), gone.len(), cluster.quorum_acked_ago(), self.lease), gone }
    }

    /// Runs `write` to its end unless this node finds no quorum left first, in two checks in a
    /// row `every` apart (a cluster side that stalled for a lease reads as unacknowledged once):
    /// then why, and `write` is dropped (an entry it appended stays in the log).
    pub async fn unless_lost<T>(&self, cluster: &Handle, write: impl Future<Output = T>) -> Result<T, String> {
        let watch = async {
            let mut before = false;
            loop {
                match self.reach(cluster).await.lost {
                    Some(why) if before => return why,
                    lost => before = lost.is_some(),
                }
                tokio::time::sleep(self.every).await;
            }
        };
        tokio::select! {
            biased;
            done = write => Ok(done),
            why = watch => Err(why),
        }
    }
}

/// Why `voters` with `gone` of them refusing, and a leader's last quorum acknowledgement
/// `acked_ago` (if leading), leave no quorum; `None` while one may be left.
fn lost(voters: usize, gone: usize, acked_ago: Option<Duration>, lease: Duration) -> Option<String> {
    if voters > 0 && voters - gone.min(voters) < voters / 2 + 1 {
        return Some(format!("{gone} of {voters} voters' cluster ports refuse connections"));
    }
    match acked_ago {
        Some(ago) if ago > lease => Some(format!(
            "no quorum has acknowledged this leader for {} ms (its lease is {} ms)",
            ago.as_millis(),
            lease.as_millis()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(2000);

    #[test]
    fn a_majority_refusing_leaves_no_quorum() {
        assert_eq!(lost(3, 0, None, LEASE), None);
        assert_eq!(lost(3, 1, None, LEASE), None, "two of three are a quorum");
        assert_eq!(lost(3, 2, None, LEASE).as_deref(), Some("2 of 3 voters' cluster ports refuse connections"));
        assert_eq!(lost(5, 2, None, LEASE), None);
        assert!(lost(5, 3, None, LEASE).is_some());
        assert_eq!(lost(1, 0, None, LEASE), None, "a one-node cluster is its own quorum");
        assert_eq!(lost(0, 0, None, LEASE), None, "no membership yet: nothing to judge");
    }

    #[test]
    fn a_leader_unacknowledged_for_its_lease_has_no_quorum() {
        assert_eq!(lost(3, 0, Some(LEASE), LEASE), None, "acknowledged a lease ago: still within it");
        let why = lost(3, 0, Some(LEASE + Duration::from_millis(1)), LEASE).expect("past its lease");
        assert!(why.contains("2001 ms") && why.contains("2000 ms"), "{why}");
        assert_eq!(lost(3, 0, None, LEASE), None, "not leading, or not acknowledged yet this term");
    }
}
