//! The receiving side of Raft RPC: decodes a request body in the project codec, hands it to the
//! local Raft instance and encodes its answer (the remote `RaftError` included, so the sender's
//! network maps it to `RPCError::RemoteError`). The cluster listener routes `/raft/*` here.

use crate::codec::{decode, decode_with_bytes, encode, CodecError};

use openraft::error::RaftError;

use super::types::{Raft, Snapshot, SnapshotMeta, TypeConfig, Vote};

/// Which Raft message a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcKind {
    Append,
    Vote,
    Snapshot,
    /// The leader hands leadership to this node (it is about to stop).
    TransferLeader,
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The body did not decode: answered 400.
    #[error("undecodable request: {0}")]
    BadRequest(CodecError),
    #[error("cannot encode the reply: {0}")]
    Encode(CodecError),
}

/// Runs one Raft RPC; the answer is the encoded `Result` openraft returned.
pub async fn serve(raft: &Raft, kind: RpcKind, body: &[u8]) -> Result<Vec<u8>, RpcError> {
    let reply = match kind {
        RpcKind::Append => encode(&raft.append_entries(decode(body).map_err(RpcError::BadRequest)?).await),
        RpcKind::Vote => encode(&raft.vote(decode(body).map_err(RpcError::BadRequest)?).await),
        RpcKind::Snapshot => {
            let ((vote, meta), data): ((Vote, SnapshotMeta), &[u8]) =
                decode_with_bytes(body).map_err(RpcError::BadRequest)?;
            let snapshot = Snapshot { meta, snapshot: std::io::Cursor::new(data.to_vec()) };
            let res = raft.install_full_snapshot(vote, snapshot).await.map_err(RaftError::<TypeConfig>::Fatal);
            encode(&res)
        }
        RpcKind::TransferLeader => {
            let req = decode(body).map_err(RpcError::BadRequest)?;
            encode(&raft.handle_transfer_leader(req).await.map_err(RaftError::<TypeConfig>::Fatal))
        }
    };
    reply.map_err(RpcError::Encode)
}
