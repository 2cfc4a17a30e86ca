//! The device wire protocol shared by server and client: JSON frames tagged by `t`, and the close
//! codes (design §4). Leaf module: imports nothing of the crate.

use serde::{Deserialize, Serialize};

/// The largest `attempt` a handshake may carry (2^53: exact in every JSON number, and out of
/// reach of any honest counter). A larger one is refused `400 bad_attempt`, so no token holder can
/// pin a device's floor where no later attempt can beat it; clients saturate here.
pub const MAX_ATTEMPT: u64 = 1 << 53;

/// Close codes a device can see, and what it should do about each.
pub mod close {
    /// Normal closure (idle timeout, client asked).
    pub const NORMAL: u16 = 1000;
    /// The node is draining: reconnect promptly, elsewhere.
    pub const GOING_AWAY: u16 = 1001;
    /// A frame the protocol does not allow (binary frames, text that is not UTF-8, protocol
    /// errors). Well-formed text that is not a known frame gets `{"t":"error"}` instead.
    pub const POLICY: u16 = 1008;
    /// A message over the size limit.
    pub const TOO_BIG: u16 = 1009;
    /// The node lost its quorum or lease: reconnect with backoff.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// No close frame: the connection dropped (reported by clients, never sent).
    pub const ABNORMAL: u16 = 1006;
    /// A newer claim for this device won: another instance of the device took over. Do not reconnect.
    pub const SUPERSEDED: u16 = 4001;
    /// This node's lease lapsed and its routes were swept: reconnect with backoff.
    pub const ROUTE_LOST: u16 = 4002;
}

/// Frames the server sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ServerFrame {
    /// First frame after the upgrade.
    /// `stream_head` is the device's last message seq: sync from your cursor to get what you missed.
    /// `next_url` is where placement would send this device if this node went away (its ring owner
    /// among the others): dial it first after losing this connection, with `?fallback=<node>`.
    Hello {
        device: String,
        node: String,
        node_id: u64,
        conn: u64,
        route_version: u64,
        stream_head: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next_url: Option<String>,
    },
    /// A message published to the device (`payload` is the backend's JSON). The server builds
    /// this frame with [`msg_json`], splicing the stored payload text in without re-parsing it.
    Msg { seq: u64, payload: serde_json::Value },
    /// The cursor a `sync` named is older than retention: messages before `oldest` are gone (the
    /// device resyncs from its backend); the retained ones follow.
    SyncGap { oldest: u64 },
    /// The node's budget for sync pages is spent (a reconnect storm): the sync in progress pauses
    /// and the node resumes it by itself after about `retry_after_ms`; nothing is skipped and the
    /// device need not ask again.
    SyncBusy { retry_after_ms: u64 },
    /// The node is draining; a close 1001 follows.
    Goaway { reason: String },
    /// Answer to a client `ping`.
    Pong,
    /// A client frame was not understood (the connection stays open).
    Error { error: String },
    /// The upstream answered 2xx to the `up` with this id.
    UpAck { id: u64 },
    /// The `up` with this id was not delivered (as far as this node knows: it may have reached the
    /// upstream all the same, so a retry must reuse the id). `retry_after_ms` present: retry the
    /// same id after at least that long; absent: retrying will not help (`status` is the
    /// upstream's 4xx when it refused).
    UpNack {
        id: u64,
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
    },
}

/// Frames a device sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum ClientFrame {
    /// Application-level liveness check; answered with `pong`.
    Ping,
    /// Send every retained message with seq > `after`, then live ones (`{"t":"msg",...}`), or
    /// `{"t":"sync_gap","oldest":S}` first when `after` is older than retention.
    Sync { after: u64 },
    /// Everything up to `seq` arrived: the stream may drop it.
    Ack { seq: u64 },
    /// Forward `payload` (any JSON) to the backend, with `Idempotency-Key: <device>:<id>`; answered
    /// with `up_ack` or `up_nack` carrying the same `id`. A retry reuses the id.
    Up { id: u64, payload: serde_json::Value },
}

impl ServerFrame {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain enum")
    }
}

impl ClientFrame {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("plain enum")
    }
}

/// The text of [`ServerFrame::Msg`] around a payload that is already valid JSON text.
pub fn msg_json(seq: u64, payload_json: &str) -> String {
    format!(r#"{{"t":"msg","seq":{seq},"payload":{payload_json}}}"#)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_have_the_documented_shape() {
        let hello = ServerFrame::Hello {
            device: "d1".into(),
            node: "n1".into(),
            node_id: 7,
            conn: 9,
            route_version: 3,
            stream_head: 0,
            next_url: Some("ws://127.0.0.1:8002/ws".into()),
        };
        let v: serde_json::Value = serde_json::from_str(&hello.to_json()).unwrap();
        assert_eq!(v["t"], "hello");
        assert_eq!(v["route_version"], 3);
        assert_eq!(v["next_url"], "ws://127.0.0.1:8002/ws");
        // A hello without the optional field (an older server) still parses.
        let old = r#"{"t":"hello","device":"d","node":"n1","node_id":1,"conn":2,"route_version":1,"stream_head":0}"#;
        assert!(matches!(serde_json::from_str::<ServerFrame>(old).unwrap(), ServerFrame::Hello { next_url: None, .. }));
        let g: serde_json::Value =
            serde_json::from_str(&ServerFrame::Goaway { reason: "drain".into() }.to_json()).unwrap();
        assert_eq!((g["t"].as_str(), g["reason"].as_str()), (Some("goaway"), Some("drain")));
        assert_eq!(serde_json::from_str::<ClientFrame>(r#"{"t":"ping"}"#).unwrap(), ClientFrame::Ping);
        assert_eq!(
            serde_json::from_str::<ClientFrame>(r#"{"t":"sync","after":4}"#).unwrap(),
            ClientFrame::Sync { after: 4 }
        );
        assert_eq!(serde_json::from_str::<ClientFrame>(r#"{"t":"ack","seq":5}"#).unwrap(), ClientFrame::Ack { seq: 5 });
        assert!(serde_json::from_str::<ClientFrame>(r#"{"t":"nope"}"#).is_err());
        assert_eq!(ClientFrame::Sync { after: 4 }.to_json(), r#"{"t":"sync","after":4}"#);
        let gap: ServerFrame = serde_json::from_str(&ServerFrame::SyncGap { oldest: 8 }.to_json()).unwrap();
        assert_eq!(gap, ServerFrame::SyncGap { oldest: 8 });
        assert_eq!(
            ServerFrame::SyncBusy { retry_after_ms: 250 }.to_json(),
            r#"{"t":"sync_busy","retry_after_ms":250}"#
        );
    }

    #[test]
    fn up_frames_have_the_documented_shape() {
        let up: ClientFrame = serde_json::from_str(r#"{"t":"up","id":3,"payload":{"temp":21}}"#).unwrap();
        assert_eq!(up, ClientFrame::Up { id: 3, payload: serde_json::json!({"temp": 21}) });
        assert!(serde_json::from_str::<ClientFrame>(r#"{"t":"up","payload":{}}"#).is_err(), "an up needs an id");
        assert_eq!(ServerFrame::UpAck { id: 3 }.to_json(), r#"{"t":"up_ack","id":3}"#);
        let nack = ServerFrame::UpNack { id: 4, reason: "overloaded".into(), retry_after_ms: Some(250), status: None };
        assert_eq!(nack.to_json(), r#"{"t":"up_nack","id":4,"reason":"overloaded","retry_after_ms":250}"#);
        let refused = r#"{"t":"up_nack","id":5,"reason":"rejected","status":422}"#;
        let parsed: ServerFrame = serde_json::from_str(refused).unwrap();
        assert_eq!(
            parsed,
            ServerFrame::UpNack { id: 5, reason: "rejected".into(), retry_after_ms: None, status: Some(422) }
        );
    }

    #[test]
    fn spliced_msg_parses_as_the_msg_frame() {
        let text = msg_json(7, r#"{"cmd":"reboot","n":[1,2]}"#);
        let frame: ServerFrame = serde_json::from_str(&text).unwrap();
        assert_eq!(frame, ServerFrame::Msg { seq: 7, payload: serde_json::json!({"cmd": "reboot", "n": [1, 2]}) });
        assert_eq!(serde_json::from_str::<ServerFrame>(&frame.to_json()).unwrap(), frame);
    }
}
