//! Raft RPC endpoints and the leader's forwarded-write endpoint; bodies in the project codec,
//! handled by the cluster port.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::{error, Api};
use crate::answer::Resp;
use crate::cluster::{RpcError, RpcKind};

fn binary(bytes: Vec<u8>) -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static response parts")
}

/// `/raft/{append,vote,snapshot}`.
pub async fn raft(api: &Api, kind: RpcKind, body: &[u8]) -> Resp {
    match api.cluster.rpc(kind, body).await {
        Ok(reply) => binary(reply),
        Err(e @ RpcError::BadRequest(_)) => error(StatusCode::BAD_REQUEST, "bad_request", e),
        Err(e @ RpcError::Encode(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, "encode", e),
    }
}

/// Commands a follower forwarded; they join this node's next batches.
pub async fn propose(api: &Api, body: &[u8]) -> Resp {
    match api.cluster.propose_forwarded(body).await {
        Ok(replies) => binary(replies),
        Err(e @ RpcError::BadRequest(_)) => error(StatusCode::BAD_REQUEST, "bad_request", e),
        Err(e @ RpcError::Encode(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, "encode", e),
    }
}
