//! openraft's network over HTTP: `POST /raft/{append,vote,snapshot}` on the target's cluster
//! listener, bodies in the project codec. One pooled client is shared by every target, so
//! `new_client` is cheap (openraft 0.9 creates one per voter per linearizable read).

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::types::TypeConfig;
use crate::codec::{decode, encode};
use crate::http::{HttpClient, HttpError, MAX_APPEND_BYTES, MAX_RPC_BYTES};
use crate::machine::{Member, NodeId};

/// Creates per-target clients sharing one connection pool.
#[derive(Clone)]
pub struct Network {
    http: HttpClient,
}

impl Network {
    pub fn new(http: HttpClient) -> Self {
        Network { http }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Peer {
        Peer { http: self.http.clone(), target, node: node.clone() }
    }
}

/// The client for one target node.
pub struct Peer {
    http: HttpClient,
    target: NodeId,
    node: Member,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl Peer {
    async fn send<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>>
    where
        Req: Serialize + Entries,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let limit = if entries(req).is_some() { MAX_APPEND_BYTES } else { MAX_RPC_BYTES };
        if body.len() > limit && entries(req).is_some_and(|n| n > 1) {
            return Err(too_large(entries(req), body.len(), limit));
        }
        // The target id rides along so that a wiped node answering on the old address refuses
        // messages meant for its former identity (openraft would see a follower log reversion).
        let path = format!("{path}?target={}", self.target);
        let (status, bytes) =
            self.http.post_bin(&self.node.cluster_addr, &path, body, option.hard_ttl()).await.map_err(|e| match e {
                HttpError::Connect { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                _ => RPCError::Network(NetworkError::new(&e)),
            })?;
        if status == hyper::StatusCode::CONFLICT {
            // Another identity answers on that address (a wiped node): like nobody home.
            let msg = Msg(format!("{} is now another node: {}", self.node, String::from_utf8_lossy(&bytes)));
            return Err(RPCError::Unreachable(Unreachable::new(&msg)));
        }
        if status == hyper::StatusCode::PAYLOAD_TOO_LARGE {
            // The peer's limit is lower than ours: ask openraft for half as many entries.
            return Err(too_large(entries(req), 2, 1));
        }
        if !status.is_success() {
            let msg = Msg(format!("{} answered {status}: {}", self.node, String::from_utf8_lossy(&bytes)));
            return Err(RPCError::Network(NetworkError::new(&msg)));
        }
        let res: Result<Resp, RaftError<NodeId, E>> =
            decode(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e)))
    }
}

/// How many log entries a request carries (appends only), for the size hint.
trait Entries {
    fn entries(&self) -> Option<usize> {
        None
    }
}

impl Entries for AppendEntriesRequest<TypeConfig> {
    fn entries(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}
impl Entries for InstallSnapshotRequest<TypeConfig> {}
impl Entries for VoteRequest<NodeId> {}

fn entries(req: &impl Entries) -> Option<usize> {
    req.entries()
}

/// A request of `len` bytes with `entries` log entries is over `limit`: openraft retries an append
/// with as many entries as fit (a proportional hint, fewer than now, at least one: the proposer
/// keeps every single entry below the limit), instead of resending the same range forever.
fn too_large<E: std::error::Error>(
    entries: Option<usize>,
    len: usize,
    limit: usize,
) -> RPCError<NodeId, Member, RaftError<NodeId, E>> {
    let hint = entries.map_or(1, |n| (n * limit / len.max(1)).clamp(1, n.saturating_sub(1).max(1)));
    RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(hint as u64))
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.send("/raft/append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.send("/raft/snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.send("/raft/vote", &rpc, &option).await
    }
}
