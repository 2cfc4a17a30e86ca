//! The bootstrap guard (`serve --peers`): before a fresh data dir bootstraps a one-node cluster,
//! ask the peers whether one of them already belongs to a cluster, so that a node whose volume was
//! lost rejoins its cluster instead of starting a second one beside it. Asks and decides only;
//! the node carries the verdict out (bootstrap, or join through the member that answered).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http::HttpClient;
use crate::machine::NodeId;
use crate::wire::StatusReport;

/// The longest one peer is waited for in a round (a black-holed address costs no more).
const ASK_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between rounds while no peer has answered as a member.
const ROUND_PAUSE: Duration = Duration::from_millis(300);

/// Who is asking: the fresh node, to recognise an old identity of itself among the members.
#[derive(Debug, Clone)]
pub struct Me {
    pub id: NodeId,
    pub name: String,
    pub cluster_addr: String,
}

/// What one peer said.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// No answer in time (nothing listens, DNS does not resolve yet, a timeout).
    Silent(String),
    /// It answered but refused or was not understood (another secret, another program).
    Refused(String),
    /// A node that is not in a cluster yet (a peer waiting to `--join` this one, say).
    Outside,
    /// A member of a cluster.
    Member {
        cluster_id: Option<String>,
        /// A member that has this node's name or address under another id: an old identity of
        /// this node, which `gateway leave` must remove before this node can join.
        old_self: Option<(NodeId, String)>,
    },
}

/// What the fresh node does.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Join the cluster of the member at `via`.
    Join { via: String, cluster_id: Option<String>, old_self: Option<(NodeId, String)> },
    /// Bootstrap: every peer answered and none is in a cluster.
    BootstrapAllOutside,
    /// Bootstrap: the wait ran out and no peer answered as a member.
    BootstrapWaited,
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "the peers belong to different clusters ({a} is in cluster {a_id}, {b} in cluster {b_id}): \
         refusing to start; make --peers name members of one cluster"
    )]
    TwoClusters { a: String, a_id: String, b: String, b_id: String },
    #[error("stopped while asking the peers")]
    Cancelled,
}

/// One round's answers → a verdict, `None` to keep asking, or the two-cluster refusal.
pub fn judge(answers: &[(String, Answer)]) -> Result<Option<Verdict>, GuardError> {
    let mut first_member: Option<Verdict> = None;
    let mut known: Option<(&String, &String)> = None;
    for (peer, answer) in answers {
        let Answer::Member { cluster_id, old_self } = answer else { continue };
        match (cluster_id, known) {
            (Some(id), Some((a, a_id))) if a_id != id => {
                return Err(GuardError::TwoClusters {
                    a: a.clone(),
                    a_id: a_id.clone(),
                    b: peer.clone(),
                    b_id: id.clone(),
                })
            }
            (Some(id), None) => known = Some((peer, id)),
            _ => {}
        }
        first_member.get_or_insert_with(|| Verdict::Join {
            via: peer.clone(),
            cluster_id: cluster_id.clone(),
            old_self: old_self.clone(),
        });
    }
    if first_member.is_some() {
        return Ok(first_member);
    }
    let all_outside = !answers.is_empty() && answers.iter().all(|(_, a)| *a == Answer::Outside);
    Ok(all_outside.then_some(Verdict::BootstrapAllOutside))
}

/// Reads a peer's `/cluster/status` answer.
pub fn classify(me: &Me, report: &StatusReport) -> Answer {
    if report.cluster_id.is_none() && report.members.is_empty() {
        return Answer::Outside;
    }
    let old_self = report
        .members
        .iter()
        .find(|m| m.id != me.id && (m.name == me.name || m.cluster_addr == me.cluster_addr))
        .map(|m| (m.id, m.name.clone()));
    Answer::Member { cluster_id: report.cluster_id.clone(), old_self }
}

async fn ask(http: &HttpClient, me: &Me, peer: &str, timeout: Duration) -> Answer {
    match http.get(peer, "/cluster/status", timeout).await {
        Ok((status, body)) if status.is_success() => match serde_json::from_slice::<StatusReport>(&body) {
            Ok(report) => classify(me, &report),
            Err(e) => Answer::Refused(format!("unreadable status: {e}")),
        },
        Ok((status, _)) if status == hyper::StatusCode::UNAUTHORIZED => {
            Answer::Refused("401: the cluster secret was refused".into())
        }
        Ok((status, _)) => Answer::Refused(format!("status {status}")),
        Err(e) => Answer::Silent(e.to_string()),
    }
}

/// Asks every peer in rounds until one answers as a member (join it), every one answers from
/// outside a cluster (bootstrap now), or `wait` runs out (bootstrap), logging each round.
pub async fn decide(
    http: &HttpClient,
    me: &Me,
    peers: &[String],
    wait: Duration,
    cancel: &CancellationToken,
) -> Result<Verdict, GuardError> {
    let started = Instant::now();
    let deadline = started + wait;
    tracing::info!(peers = ?peers, wait_ms = wait.as_millis() as u64, "bootstrap guard: no cluster in the data dir; asking the peers whether one already exists before bootstrapping");
    loop {
        let mut answers = Vec::with_capacity(peers.len());
        for peer in peers {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(200));
            let answer = ask(http, me, peer, left.min(ASK_TIMEOUT)).await;
            if let Answer::Refused(why) = &answer {
                tracing::warn!(peer = %peer, reason = %why, "bootstrap guard: peer answered but refused");
            }
            answers.push((peer.clone(), answer));
        }
        if let Some(verdict) = judge(&answers)? {
            return Ok(verdict);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Verdict::BootstrapWaited);
        }
        let summary: Vec<String> = answers.iter().map(|(p, a)| format!("{p}: {}", short(a))).collect();
        tracing::info!(
            answers = ?summary,
            bootstrap_in_ms = left.as_millis() as u64,
            "bootstrap guard: no peer is in a cluster yet; asking again"
        );
        tokio::select! {
            _ = cancel.cancelled() => return Err(GuardError::Cancelled),
            _ = tokio::time::sleep(ROUND_PAUSE.min(left)) => {}
        }
    }
}

fn short(a: &Answer) -> &str {
    match a {
        Answer::Silent(_) => "no answer",
        Answer::Refused(_) => "refused",
        Answer::Outside => "not in a cluster",
        Answer::Member { .. } => "member",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str) -> Answer {
        Answer::Member { cluster_id: Some(id.into()), old_self: None }
    }

    fn at(p: &str, a: Answer) -> (String, Answer) {
        (p.to_string(), a)
    }

    #[test]
    fn a_member_wins_over_silence_and_outsiders() {
        let answers = [at("a", Answer::Silent("refused".into())), at("b", Answer::Outside), at("c", member("x"))];
        let v = judge(&answers).unwrap().unwrap();
        assert_eq!(v, Verdict::Join { via: "c".into(), cluster_id: Some("x".into()), old_self: None });
    }

    #[test]
    fn two_cluster_ids_refuse() {
        let answers = [at("a", member("x")), at("b", member("x")), at("c", member("y"))];
        match judge(&answers) {
            Err(GuardError::TwoClusters { a, b, .. }) => assert_eq!((a.as_str(), b.as_str()), ("a", "c")),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn outsiders_only_bootstrap_now_silence_waits() {
        assert_eq!(
            judge(&[at("a", Answer::Outside), at("b", Answer::Outside)]).unwrap(),
            Some(Verdict::BootstrapAllOutside)
        );
        assert_eq!(judge(&[at("a", Answer::Outside), at("b", Answer::Silent("x".into()))]).unwrap(), None);
        assert_eq!(judge(&[at("a", Answer::Refused("401".into()))]).unwrap(), None);
    }
}
