//! Whether a stopping node still has a quorum to write through. A drain's two writes (`Drain`,
//! `ReleaseNode`) and its leader hand-over need one. When the members are stopped together
//! (`docker compose down`, a host shutdown) or one at a time with the leader last, the last node
//! standing has none: without this check it waited out the write timeout (`--propose-timeout-ms`)
//! for each write and a leader lease for the hand-over before it exited, 12–14 s with the
//! defaults. Its routes then go as a killed node's do (V6 by the lease): swept when its lease
//! lapses, or released by its restarted process's first renewal.
//!
//! No quorum is left when the voters whose cluster port refuses connections (their process is
//! gone: [`super::detector::port_refuses`]) leave fewer than a majority, or when this node has
//! been without word for a leader lease: on a leader, no quorum acknowledged it (a stopped
//! container's address times out instead of refusing, and so does a paused or cut-off voter); on
//! a follower, no leader's append or heartbeat came. Shorter silences are waited out.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use super::detector::port_refuses;
use crate::cluster::Handle;
use crate::machine::NodeId;

/// What this node can reach of the voters, as probed once.
#[derive(Debug)]
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
        let silence = match cluster.quorum_acked_ago() {
            Some(ago) => Some(Silence::Leading(ago)),
            None if cluster.leader() != Some(me) => cluster.since_last_append().map(Silence::Following),
            None => None,
        };
        Reach { lost: lost(voters.len(), gone.len(), silence, self.lease), gone }
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

/// How long this node has gone without word from the rest of the cluster.
#[derive(Debug, Clone, Copy)]
enum Silence {
    /// Leading: since a quorum last acknowledged it.
    Leading(Duration),
    /// Following: since a leader's last append or heartbeat reached it.
    Following(Duration),
}

/// Why `voters` with `gone` of them refusing, or this node's `silence` (not on a lone voter, its
/// own quorum), leave no quorum; `None` while one may be left. Silence for a leader lease is no
/// quorum: a leader refuses writes then, and a follower's writes wait for an election.
fn lost(voters: usize, gone: usize, silence: Option<Silence>, lease: Duration) -> Option<String> {
    if voters > 0 && voters - gone.min(voters) < voters / 2 + 1 {
        return Some(format!("{gone} of {voters} voters' cluster ports refuse connections"));
    }
    let (ms, lease_ms) = (|d: Duration| d.as_millis(), lease.as_millis());
    match silence {
        _ if voters <= 1 => None,
        Some(Silence::Leading(ago)) if ago > lease => {
            Some(format!("no quorum has acknowledged this leader for {} ms (a leader lease is {lease_ms} ms)", ms(ago)))
        }
        Some(Silence::Following(ago)) if ago > lease => {
            Some(format!("no leader has been heard from for {} ms (a leader lease is {lease_ms} ms)", ms(ago)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(2000);

    const PAST: Duration = Duration::from_millis(2001);

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
    fn silence_for_a_leader_lease_leaves_no_quorum() {
        use Silence::{Following, Leading};
        assert_eq!(lost(3, 0, Some(Leading(LEASE)), LEASE), None, "acknowledged a lease ago: still within it");
        let why = lost(3, 0, Some(Leading(PAST)), LEASE).expect("past its lease");
        assert!(why.contains("acknowledged this leader for 2001 ms") && why.contains("2000 ms"), "{why}");
        assert_eq!(lost(3, 0, Some(Following(LEASE)), LEASE), None, "heard from a leader a lease ago");
        let why = lost(3, 0, Some(Following(PAST)), LEASE).expect("no leader for a lease");
        assert!(why.contains("no leader has been heard from for 2001 ms"), "{why}");
        assert_eq!(lost(3, 0, None, LEASE), None, "not acknowledged yet this term, or never heard a leader");
        assert_eq!(lost(1, 0, Some(Leading(LEASE * 10)), LEASE), None, "a lone voter is its own quorum");
    }
}
