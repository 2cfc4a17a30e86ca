//! openraft's network (v2) over HTTP: `POST /raft/v2/{append,vote,snapshot,transfer-leader}` on the target's
//! cluster listener, bodies in the project codec. `v2` is openraft 0.10's message layout: a node of
//! the 0.9 layout (`/raft/append`, ...) answers 404, a failed RPC, never a misread one. An append
//! over the size limit sends the entries that fit and reports a partial success; a snapshot goes
//! whole, in one request. One pooled client is shared by every target, so `new_client` is cheap.
//!
//! Replication and heartbeats (openraft's `stream_append`) go over a pipelined connection of their
//! own ([`super::stream`]) that each client keeps between streams. A target without the stream
//! endpoint (an older build answers 404) gets one `/raft/v2/append` request per append, and is
//! asked again after [`RETRY_STREAM`].

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{stream_append_sequential, RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::stream::{self, Link};
use super::types::{Snapshot, SnapshotData, TypeConfig, Vote};
use crate::codec::{decode, encode, head_for_bytes, CodecError};
use crate::http::{excerpt, HttpClient, HttpError, MAX_APPEND_BYTES, MAX_RPC_BYTES};
use crate::machine::{Member, NodeId};

type RpcErr = RPCError<TypeConfig>;

/// How long a target that has no stream endpoint is sent one HTTP request per append before it is
/// asked for a stream again (it may have been upgraded).
pub const RETRY_STREAM: Duration = Duration::from_secs(30);

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
        Peer { http: self.http.clone(), target, node: node.clone(), link: None, http_until: None }
    }
}

/// The client for one target node.
pub struct Peer {
    http: HttpClient,
    target: NodeId,
    node: Member,
    /// The append stream's connection, kept between streams.
    link: Option<Link>,
    /// Until when appends go one HTTP request each (the target had no stream endpoint).
    http_until: Option<Instant>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

impl Peer {
    /// Posts `body` and decodes the target's answer, a `Result` with openraft's error `E`.
    async fn send<Resp, E>(
        &self,
        path: &str,
        body: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig, E>>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        // The target id rides along so that a wiped node answering on the old address refuses
        // messages meant for its former identity (openraft would see a follower log reversion).
        let path = format!("{path}?target={}", self.target);
        let (status, bytes) =
            self.http.post_bin(&self.node.cluster_addr, &path, body, option.hard_ttl()).await.map_err(|e| match e {
                HttpError::Connect { .. } => RPCError::Unreachable(Unreachable::new(&e)),
                _ => RPCError::Network(NetworkError::new(&e)),
            })?;
        if !status.is_success() {
            return Err(self.refused(status, &bytes));
        }
        let res: Result<Resp, E> = decode(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| RPCError::RemoteError(RemoteError::new_with_node(self.target, self.node.clone(), e)))
    }

    /// The error for a request the target answered with `status` (not a success).
    fn refused<E: std::error::Error>(&self, status: hyper::StatusCode, bytes: &[u8]) -> RPCError<TypeConfig, E> {
        if status == hyper::StatusCode::CONFLICT {
            // Another identity answers on that address (a wiped node): like nobody home.
            let msg = Msg(format!("{} is now another node: {}", self.node, excerpt(bytes)));
            return RPCError::Unreachable(Unreachable::new(&msg));
        }
        let msg = Msg(format!("{} answered {status}: {}", self.node, excerpt(bytes)));
        RPCError::Network(NetworkError::new(&msg))
    }

    /// Opens an append stream to the target; None when it has no stream endpoint (404).
    async fn dial(&self, option: &RPCOption) -> Result<Option<Link>, RpcErr> {
        let path = format!("{}?target={}", stream::PATH, self.target);
        let addr = &self.node.cluster_addr;
        match self.http.upgrade(addr, &path, stream::PROTOCOL, option.hard_ttl()).await {
            Ok(Ok(upgraded)) => Ok(Some(Link::new(hyper_util::rt::TokioIo::new(upgraded)))),
            Ok(Err((hyper::StatusCode::NOT_FOUND, _))) => Ok(None),
            Ok(Err((status, bytes))) => Err(self.refused(status, &bytes)),
            Err(e @ HttpError::Connect { .. }) => Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }
}

fn encoded<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, RpcErr> {
    encode(v).map_err(|e| RPCError::Network(NetworkError::new(&e)))
}

/// The longest prefix of `req`'s entries whose encoding fits in `limit` (at least one entry: the
/// proposer keeps every single entry well below it), encoded. openraft is told the rest was not
/// sent with a partial success.
fn fit(whole: &AppendEntriesRequest<TypeConfig>, limit: usize) -> Result<(Vec<u8>, Option<usize>), RpcErr> {
    let mut body = encoded(whole)?;
    let all = whole.entries.len();
    if body.len() <= limit || all <= 1 {
        return Ok((body, None));
    }
    let mut req = whole.clone();
    while body.len() > limit && req.entries.len() > 1 {
        let n = req.entries.len();
        let keep = (n * limit / body.len().max(1)).clamp(1, n - 1);
        req.entries.truncate(keep);
        body = encoded(&req)?;
    }
    let sent = req.entries.len();
    Ok((body, (sent < all).then_some(sent)))
}

impl RaftNetworkV2<TypeConfig> for Peer {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcErr> {
        let last_sent = |n: usize| rpc.entries.get(n.wrapping_sub(1)).map(|e| e.log_id).or(rpc.prev_log_id);
        let (body, partial) = fit(&rpc, MAX_APPEND_BYTES)?;
        let resp: AppendEntriesResponse<TypeConfig> =
            self.send::<_, RaftError<TypeConfig>>("/raft/v2/append", body, &option).await.map_err(remote_fatal)?;
        Ok(match (resp, partial) {
            (AppendEntriesResponse::Success, Some(n)) => AppendEntriesResponse::PartialSuccess(last_sent(n)),
            (resp, _) => resp,
        })
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RpcErr>>, RpcErr>>
    where
        S: futures_util::Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        Box::pin(async move {
            // The first request before anything else: openraft sleeps its backoff (after failed
            // sessions) inside the request stream. Dialling first, a target that refuses
            // connections (killed, its name gone from DNS) failed every session at once and the
            // leader redialled it about a thousand times a second, logging each.
            let mut input = input;
            let Some(first) = input.next().await else {
                return Ok(Box::pin(futures_util::stream::empty()) as BoxStream<'s, _>);
            };
            let input = futures_util::stream::iter([first]).chain(input);
            if self.http_until.is_some_and(|until| Instant::now() < until) {
                return stream_append_sequential(self, input, option).await;
            }
            let kept = self.link.take().and_then(|mut link| link.reusable().then_some(link));
            let link = match kept {
                Some(link) => link,
                None => match self.dial(&option).await? {
                    Some(link) => link,
                    None => {
                        tracing::info!(target_node = %self.node, "no append stream endpoint there: one request per append");
                        self.http_until = Some(Instant::now() + RETRY_STREAM);
                        return stream_append_sequential(self, input, option).await;
                    }
                },
            };
            let peer = self.node.to_string();
            let cut = |req: &AppendEntriesRequest<TypeConfig>| fit(req, MAX_APPEND_BYTES);
            Ok(stream::pipeline(link, &mut self.link, input, option.hard_ttl(), stream::REUSE_IDLE, peer, cut))
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcErr> {
        let body = encoded(&rpc)?;
        self.send::<_, RaftError<TypeConfig>>("/raft/v2/vote", body, &option).await.map_err(remote_fatal)
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RpcErr> {
        let body = encoded(&req)?;
        self.send::<_, RaftError<TypeConfig>>("/raft/v2/transfer-leader", body, &option).await.map_err(remote_fatal)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let body = snapshot_body(&vote, snapshot).map_err(|e| StreamingError::Network(NetworkError::new(&e)))?;
        if body.len() > MAX_RPC_BYTES {
            let msg = Msg(format!("a snapshot of {} bytes is over the {MAX_RPC_BYTES}-byte RPC limit", body.len()));
            return Err(StreamingError::Network(NetworkError::new(&msg)));
        }
        let send = self.send::<SnapshotResponse<TypeConfig>, RaftError<TypeConfig>>("/raft/v2/snapshot", body, &option);
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            res = send => res.map_err(|e| match remote_fatal(e) {
                RPCError::Timeout(t) => StreamingError::Timeout(t),
                RPCError::Unreachable(u) => StreamingError::Unreachable(u),
                RPCError::Network(n) => StreamingError::Network(n),
                RPCError::RemoteError(r) => match r.source {},
            }),
        }
    }
}

/// The snapshot RPC's body, `encode_with_bytes(&(vote, meta), data)`, written in the data's own
/// buffer (the head moved in front of the bytes): a leader sending a million devices' snapshot
/// (~57 MB) holds it once while the follower takes it, not twice. A kept snapshot is read with
/// room for the head (`store::kept::SPARE`, and the meta taken off its front), so the buffer does
/// not grow.
pub fn snapshot_body(vote: &Vote, snapshot: Snapshot) -> Result<Vec<u8>, CodecError> {
    let mut body = snapshot.snapshot.into_inner();
    let head = head_for_bytes(&(vote, &snapshot.meta), body.len())?;
    body.reserve_exact(head.len());
    body.splice(0..0, head);
    Ok(body)
}

/// A remote `RaftError` (the target's Raft is shutting down or failed) is, to the sender, a
/// target that cannot take the message now.
fn remote_fatal(e: RPCError<TypeConfig, RaftError<TypeConfig>>) -> RpcErr {
    match e {
        RPCError::Timeout(t) => RPCError::Timeout(t),
        RPCError::Unreachable(u) => RPCError::Unreachable(u),
        RPCError::Network(n) => RPCError::Network(n),
        RPCError::RemoteError(r) => RPCError::Unreachable(Unreachable::from_string(r)),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::codec::encode_with_bytes;
    use crate::raft::state_machine::decode_snapshot;
    use crate::raft::types::{log_id, SnapshotMeta};

    #[test]
    fn a_snapshot_body_is_the_encoding_of_vote_meta_and_data_in_the_data_buffer() {
        let vote = Vote::new_committed(7, 300);
        let meta = SnapshotMeta { last_log_id: Some(log_id(7, 300, 1 << 40)), ..Default::default() };
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let expected = encode_with_bytes(&(&vote, &meta), &data).unwrap();
        // As a leader has it: the kept record read with room to spare, its meta taken off in place.
        let record = encode_with_bytes(&meta, &data).unwrap();
        let mut kept = Vec::with_capacity(record.len() + crate::store::kept::SPARE);
        kept.extend_from_slice(&record);
        let (read_meta, read_data) = decode_snapshot(kept).unwrap();
        let buffer = read_data.as_ptr();
        let body = snapshot_body(&vote, Snapshot { meta: read_meta, snapshot: Cursor::new(read_data) }).unwrap();
        assert_eq!(body, expected);
        assert_eq!(body.as_ptr(), buffer, "the body is made in the data's buffer");
        // A buffer with no room grows by the head alone.
        let body = snapshot_body(&vote, Snapshot { meta, snapshot: Cursor::new(data.clone()) }).unwrap();
        assert_eq!((body.len(), body.capacity()), (expected.len(), expected.len()));
        assert_eq!(body, expected);
    }
}
