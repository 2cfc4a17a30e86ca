//! Raft RPC endpoints (the append stream's upgrade too) and the leader's forwarded-write endpoint;
//! bodies in the project codec, handled by the cluster port.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, UPGRADE};
use hyper::{Request, Response, StatusCode};

use super::{error, Api};
use crate::answer::Resp;
use crate::cluster::{RpcError, RpcKind, APPEND_STREAM_PROTOCOL};

fn binary(bytes: Vec<u8>) -> Resp {
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static response parts")
}

/// `/raft/{append,vote,snapshot}`.
pub async fn raft(api: &Api, kind: RpcKind, body: Bytes) -> Resp {
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

/// `/raft/v2/stream` (with `Upgrade:` [`APPEND_STREAM_PROTOCOL`]): answers `101` and serves the
/// connection's appends until it ends or the node stops.
pub fn stream(api: &Api, mut req: Request<Incoming>) -> Resp {
    let asks = req
        .headers()
        .get(UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(APPEND_STREAM_PROTOCOL.as_bytes()));
    if !asks {
        return error(StatusCode::BAD_REQUEST, "bad_request", format!("expected Upgrade: {}", APPEND_STREAM_PROTOCOL));
    }
    let upgrade = hyper::upgrade::on(&mut req);
    let (cluster, stop, opened) = (api.cluster.clone(), api.stop.clone(), api.metrics.raft_append_streams.clone());
    api.tasks.spawn(async move {
        match upgrade.await {
            Ok(io) => {
                opened.inc();
                cluster.serve_append_stream(hyper_util::rt::TokioIo::new(io), stop).await
            }
            Err(e) => tracing::debug!(error = %e, "raft stream: the upgrade did not complete"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, APPEND_STREAM_PROTOCOL)
        .body(Full::default())
        .expect("static response parts")
}
