//! The receiving side of Raft RPC: decodes a request body in the project codec, hands it to the
//! local Raft instance and encodes its answer (the remote `RaftError` included, so the sender's
//! network maps it to `RPCError::RemoteError`). The cluster listener routes `/raft/*` here.

use bytes::{Buf, Bytes};
use openraft::error::RaftError;

use crate::codec::{decode, decode_with_bytes, encode, CodecError};

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
pub async fn serve(raft: &Raft, kind: RpcKind, body: Bytes) -> Result<Vec<u8>, RpcError> {
    let reply = match kind {
        RpcKind::Append => encode(&raft.append_entries(decode(&body).map_err(RpcError::BadRequest)?).await),
        RpcKind::Vote => encode(&raft.vote(decode(&body).map_err(RpcError::BadRequest)?).await),
        RpcKind::Snapshot => {
            let ((vote, meta), len) = decode_with_bytes::<(Vote, SnapshotMeta)>(&body)
                .map(|(head, data)| (head, data.len()))
                .map_err(RpcError::BadRequest)?;
            let data = tail(body, len);
            let snapshot = Snapshot { meta, snapshot: std::io::Cursor::new(data) };
            let res = raft.install_full_snapshot(vote, snapshot).await.map_err(RaftError::<TypeConfig>::Fatal);
            encode(&res)
        }
        RpcKind::TransferLeader => {
            let req = decode(&body).map_err(RpcError::BadRequest)?;
            encode(&raft.handle_transfer_leader(req).await.map_err(RaftError::<TypeConfig>::Fatal))
        }
    };
    reply.map_err(RpcError::Encode)
}

/// The last `len` bytes of `body` as a `Vec`: in the body's own buffer (moved to its front) when
/// nothing else holds it, as a body read whole by the cluster listener is, so a follower taking
/// a snapshot of tens of megabytes holds it once, not twice.
fn tail(mut body: Bytes, len: usize) -> Vec<u8> {
    body.advance(body.len() - len);
    Vec::from(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_s_data_is_taken_out_of_the_body_s_own_buffer() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let owned = body.clone();
        let start = owned.as_ptr();
        let data = tail(Bytes::from(owned), 99_000);
        assert_eq!(data, body[1_000..]);
        assert_eq!(data.as_ptr(), start, "no second buffer");
        // As the cluster listener reads a body of many frames: one buffer grown as they came.
        let mut grown = Vec::with_capacity(150_000);
        grown.extend_from_slice(&body);
        let start = grown.as_ptr();
        let data = tail(Bytes::from(grown), 99_000);
        assert_eq!((&data[..], data.as_ptr()), (&body[1_000..], start));
        // A body something else still holds is copied, and stays whole.
        let shared = Bytes::from(body.clone());
        let data = tail(shared.clone(), 10);
        assert_eq!((&data[..], shared.len()), (&body[99_990..], body.len()));
    }
}
