//! Recent membership and ring events for the status page, as this node saw them apply: members
//! joining, leaving or promoted, lease states changing (live, suspect, draining, expired), the
//! ring's live set changing, the leader changing. Kept in memory (the last [`KEEP`]), lost on
//! restart: the replicated state holds the current picture, not its history.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cluster::Handle;
use crate::view::ClusterView;

/// Events kept.
pub const KEEP: usize = 50;

/// How often the recorder looks at who leads (Raft's metrics change on every append: too often
/// to wake on).
const LEADER_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiEvent {
    /// Wall-clock time this node saw it (ms since the Unix epoch).
    pub at_ms: u64,
    pub text: String,
}

/// The last [`KEEP`] events, newest last.
#[derive(Debug, Default)]
pub struct EventLog {
    entries: Mutex<VecDeque<UiEvent>>,
}

impl EventLog {
    pub fn push(&self, text: String) {
        let at_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() == KEEP {
            entries.pop_front();
        }
        entries.push_back(UiEvent { at_ms, text });
    }

    /// Newest first.
    pub fn recent(&self) -> Vec<UiEvent> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).iter().rev().cloned().collect()
    }
}

/// Records what changes in the applied view and who leads, until `stop`.
pub async fn record(cluster: Handle, log: Arc<EventLog>, stop: CancellationToken) {
    let mut views = cluster.watch();
    let mut prev = views.borrow_and_update().clone();
    log.push(format!("watching: {}", ring_line(&prev)));
    let mut leader = None;
    let mut tick = tokio::time::interval(LEADER_POLL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = views.changed() => {
                if changed.is_err() {
                    return;
                }
                let next = views.borrow_and_update().clone();
                for text in diff(&prev, &next) {
                    log.push(text);
                }
                prev = next;
            }
            _ = tick.tick() => {
                let now = cluster.leader();
                if now != leader {
                    let name = now.map_or_else(|| "none known".to_string(), |id| prev.name_of(id));
                    log.push(format!("leader: {name}"));
                    leader = now;
                }
            }
        }
    }
}

fn ring_line(view: &ClusterView) -> String {
    format!("ring v{}: live [{}]", view.state.ring_version, view.ring.nodes().join(", "))
}

/// What changed between two applied views, in words.
pub fn diff(prev: &ClusterView, next: &ClusterView) -> Vec<String> {
    let mut out = Vec::new();
    let role = |v: &ClusterView, id| if v.is_voter(id) { "voter" } else { "learner" };
    for (id, m) in next.members() {
        match prev.member(id) {
            None => out.push(format!("{} joined as a {}", m.name, role(next, id))),
            Some(_) if role(prev, id) != role(next, id) => out.push(format!("{} is now a {}", m.name, role(next, id))),
            Some(_) => {}
        }
    }
    for (id, m) in prev.members().filter(|(id, _)| next.member(*id).is_none()) {
        out.push(format!("{} ({id}) left the membership", m.name));
    }
    for (id, lease) in &next.state.nodes {
        let was = prev.lease(*id).map(|l| l.state);
        if was != Some(lease.state) {
            let name = next.name_of(*id);
            out.push(match was {
                Some(w) => format!("{name}: {} → {}", w.as_str(), lease.state.as_str()),
                None => format!("{name}: {}", lease.state.as_str()),
            });
        }
    }
    if prev.state.ring_version != next.state.ring_version || prev.ring.nodes() != next.ring.nodes() {
        out.push(ring_line(next));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{LeaseState, Member, NodeId, NodeLease, State};

    fn view(members: &[(NodeId, &str, bool, LeaseState)], ring_version: u64) -> ClusterView {
        let mut s = State { ring_version, ..State::default() };
        for &(id, name, voter, state) in members {
            let m = Member {
                name: name.into(),
                cluster_addr: format!("{name}:7070").into(),
                public_url: format!("ws://{name}").into(),
            };
            s.members.insert(id, m);
            if voter {
                s.voters.insert(id);
            }
            let lease = NodeLease {
                lease_until_ms: 0,
                state,
                connections: 0,
                routes: 0,
                incarnation: 0,
                extendable: false,
                suspect_until_ms: 0,
            };
            s.nodes.insert(id, lease);
        }
        ClusterView::new(s, None)
    }

    #[test]
    fn changes_read_as_events_and_nothing_else_does() {
        use LeaseState::*;
        let a = view(&[(1, "n1", true, Live), (2, "n2", false, Live)], 5);
        assert!(diff(&a, &a).is_empty());
        let b = view(&[(1, "n1", true, Live), (2, "n2", true, Suspect), (3, "n3", false, Live)], 9);
        assert_eq!(
            diff(&a, &b),
            ["n2 is now a voter", "n3 joined as a learner", "n2: live → suspect", "n3: live", "ring v9: live [n1, n3]"]
        );
        let c = view(&[(1, "n1", true, Live), (3, "n3", false, Draining)], 12);
        assert_eq!(diff(&b, &c), ["n2 (2) left the membership", "n3: live → draining", "ring v12: live [n1]"]);
        let log = EventLog::default();
        for i in 0..KEEP + 5 {
            log.push(format!("e{i}"));
        }
        let recent = log.recent();
        assert_eq!((recent.len(), recent[0].text.as_str()), (KEEP, format!("e{}", KEEP + 4).as_str()));
    }
}
