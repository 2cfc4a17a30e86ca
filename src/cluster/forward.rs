//! A follower's forwards to the leader (design §2 "Batching"): the request that carries a batch
//! (`POST` [`FORWARD_PATH`], project codec), the lanes that bound how many are out at once, and
//! the watch that gives a lane back once the leader it went to is replaced.

use openraft::async_runtime::WatchReceiver as _;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::OwnedSemaphorePermit;

use super::proposer::ProposeError;
use crate::codec::{decode, encode};
use crate::http::{HttpClient, HttpError};
use crate::machine::{Command, NodeId, Reply};
use crate::raft::types::Raft;

/// Where followers forward writes to the leader. Versioned: the reply layout changed with the
/// per-command replies (`machine::Reply`), and a node of another layout must answer 404 (a
/// forward error, retried) rather than be misread.
pub const FORWARD_PATH: &str = "/cluster/propose/v2";

/// Forwards to the leader a follower's bulk queue has in flight at once (its urgent queue has no
/// such bound: a renewal never waits behind another forward, and there are a few a second). A
/// forward is answered when the leader's entry commits, so a follower with only a few callers
/// forwards each at once and the leader's batches merge them (as few as
/// [`super::proposer::MAX_IN_FLIGHT`] would hold back every third caller of eight spread over
/// three nodes); a follower with many folds what queues while all are out into its next forward.
/// Six stay within the eight idle connections a host the HTTP client's pool keeps, so the
/// forwards reuse their connections instead of dialling the leader again.
pub const MAX_FORWARDS: usize = 6;

/// A forward lane in use, counted in `gateway_forward_lanes_busy` until it is let go.
pub(super) struct Lane {
    _permit: OwnedSemaphorePermit,
    busy: Gauge,
}

impl Lane {
    pub(super) fn new(permit: OwnedSemaphorePermit, busy: &Gauge) -> Lane {
        busy.inc();
        Lane { _permit: permit, busy: busy.clone() }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.busy.dec();
    }
}

/// `fut`'s output, or None once the leader this node knows changes from what it was at the call
/// to someone other than `leader` (another was elected, or an election began). Compared with the
/// leader shown at the call, not with `leader` alone: the metrics can lag the answer that named
/// `leader` (and in a handover they show this node until the new leader takes over), and a
/// difference that was there from the start must not end the wait at once, again and again.
pub(super) async fn unless_replaced<T>(
    raft: &Raft,
    leader: NodeId,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    // Server metrics change with the vote, the role, the leader and the membership only.
    let mut rx = raft.server_metrics();
    let shown = rx.borrow_watched().current_leader;
    let replaced = async move {
        loop {
            if rx.changed().await.is_err() {
                return;
            }
            let now = rx.borrow_watched().current_leader;
            if now != shown && now != Some(leader) {
                return;
            }
        }
    };
    tokio::select! {
        biased;
        out = fut => Some(out),
        () = replaced => None,
    }
}

/// Why a forward got no replies.
pub(super) enum ForwardFailed {
    /// No connection to the leader: it is gone (or cut off); another leader is worth waiting for.
    Unreached,
    Failed(ProposeError),
}
use ForwardFailed::{Failed, Unreached};

/// Sends `cmds` to the leader at `leader`; one reply per command, in order. Encoded from the
/// references: the same bytes as the commands themselves, without copying them (a publish's
/// payload among them).
pub(super) async fn forward(
    http: &HttpClient,
    leader: &str,
    cmds: &[&Command],
    deadline: tokio::time::Instant,
) -> Result<Vec<Result<Reply, ProposeError>>, ForwardFailed> {
    let failed = |e: String| Failed(ProposeError::Forward(e));
    let body = encode(&cmds).map_err(|e| failed(e.to_string()))?;
    let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
    let (status, bytes) = match http.post_bin(leader, FORWARD_PATH, body, timeout).await {
        Ok(answer) => answer,
        Err(HttpError::Connect { .. }) => return Err(Unreached),
        Err(e) => return Err(failed(e.to_string())),
    };
    if !status.is_success() {
        return Err(failed(format!("{leader} answered {status}")));
    }
    let replies: Vec<Result<Reply, ProposeError>> = decode(&bytes).map_err(|e| failed(e.to_string()))?;
    if replies.len() != cmds.len() {
        return Err(failed("reply count mismatch".into()));
    }
    // The leader's own stop is a failed forward here, not this node's stop: a caller that gives
    // up on `Stopped` (its node is ending) should try again once another node leads.
    let stopping = |r| match r {
        Err(ProposeError::Stopped) => Err(ProposeError::Forward(format!("{leader} is stopping"))),
        other => other,
    };
    Ok(replies.into_iter().map(stopping).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{Publish, Release};

    /// The leader decodes a forward as `Vec<Command>`: the references a follower encodes must
    /// give the very same bytes.
    #[test]
    fn a_forward_encoded_from_references_reads_back_as_the_commands() {
        let payload = "\"a payload\"".to_string();
        let cmds = vec![
            Command::Release(Release { device: "d1".into(), conn: 7 }),
            Command::Publish(Publish {
                device: "d2".into(),
                payload,
                key: Some("k".into()),
                at_ms: 5,
                keep_count: 100,
                keep_age_ms: 60_000,
                keep_key_ms: 60_000,
                max_keys: 100,
            }),
        ];
        let refs: Vec<&Command> = cmds.iter().collect();
        let bytes = encode(&refs).unwrap();
        assert_eq!(bytes, encode(&cmds).unwrap());
        assert_eq!(format!("{:?}", decode::<Vec<Command>>(&bytes).unwrap()), format!("{cmds:?}"));
    }
}
