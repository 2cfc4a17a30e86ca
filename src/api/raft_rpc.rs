//! Raft RPC endpoints and the leader's forwarded-write endpoint; bodies in the project codec.

use hyper::StatusCode;

use super::{binary, error, Api, Resp};
use crate::codec::{decode, encode};
use crate::raft::types::Command;

fn bad(e: impl std::fmt::Display) -> Resp {
    error(StatusCode::BAD_REQUEST, "bad_request", &e.to_string())
}

fn reply<T: serde::Serialize>(value: &T) -> Resp {
    match encode(value) {
        Ok(b) => binary(b),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "encode", &e.to_string()),
    }
}

pub async fn append(api: &Api, body: &[u8]) -> Resp {
    match decode(body) {
        Ok(req) => reply(&api.raft.append_entries(req).await),
        Err(e) => bad(e),
    }
}

pub async fn vote(api: &Api, body: &[u8]) -> Resp {
    match decode(body) {
        Ok(req) => reply(&api.raft.vote(req).await),
        Err(e) => bad(e),
    }
}

pub async fn snapshot(api: &Api, body: &[u8]) -> Resp {
    match decode(body) {
        Ok(req) => reply(&api.raft.install_snapshot(req).await),
        Err(e) => bad(e),
    }
}

/// Commands a follower forwarded; they join this node's next batches.
pub async fn propose(api: &Api, body: &[u8]) -> Resp {
    match decode::<Vec<Command>>(body) {
        Ok(cmds) => reply(&api.proposer.propose_forwarded(cmds).await),
        Err(e) => bad(e),
    }
}
