//! openraft's network over HTTP: `POST /raft/{append,vote,snapshot}` on the target's cluster
//! listener, bodies in the project codec. One pooled client is shared by every target, so
//! `new_client` is cheap (openraft 0.9 creates one per voter per linearizable read).

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::types::TypeConfig;
use crate::codec::{decode, encode};
use crate::http::{HttpClient, HttpError};
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
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = encode(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
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
        if !status.is_success() {
            let msg = Msg(format!("{} answered {status}: {}", self.node, String::from_utf8_lossy(&bytes)));
            return Err(RPCError::Network(NetworkError::new(&msg)));
        }
        let res: Result<Resp, RaftError<NodeId, E>> =
            decode(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e)))
    }
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
