//! Request ids: every HTTP request on either listener gets one, recorded on its span (so each log
//! line of the request carries it) and returned in `x-request-id`. A caller's own `x-request-id`
//! is kept only when it is short and plain ([`MAX_LEN`] characters of `[A-Za-z0-9._-]`): anything
//! else is replaced by a generated id, so neither the log nor the answer ever repeats what a
//! client put in that header.

use std::fmt;

use hyper::header::{HeaderMap, HeaderName, HeaderValue};

/// The header a request id travels in, both ways.
pub static HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The longest caller-chosen id kept.
pub const MAX_LEN: usize = 64;

/// A request's id: a caller's plain one, or 16 generated hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(String);

impl RequestId {
    /// The caller's `x-request-id` when it is acceptable, else a fresh one.
    pub fn for_request(headers: &HeaderMap) -> RequestId {
        match headers.get(&HEADER).map(HeaderValue::as_bytes) {
            Some(v) if acceptable(v) => RequestId(String::from_utf8_lossy(v).into_owned()),
            _ => RequestId::generate(),
        }
    }

    pub fn generate() -> RequestId {
        RequestId(format!("{:016x}", rand::random::<u64>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as a header value (it is plain ASCII by construction).
    pub fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(&self.0).expect("request ids are plain ASCII")
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn acceptable(v: &[u8]) -> bool {
    (1..=MAX_LEN).contains(&v.len()) && v.iter().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id_for(value: &[u8]) -> RequestId {
        let mut h = HeaderMap::new();
        h.insert(&HEADER, HeaderValue::from_bytes(value).unwrap());
        RequestId::for_request(&h)
    }

    #[test]
    fn a_plain_caller_id_is_kept_anything_else_replaced() {
        assert_eq!(id_for(b"req-42_a.b").as_str(), "req-42_a.b");
        assert_eq!(id_for("x".repeat(MAX_LEN).as_bytes()).as_str(), "x".repeat(MAX_LEN));
        for bad in [&b"<script>"[..], b"a b", b"Bearer abc", b"\xff\xfe", b"id\"}"] {
            let id = id_for(bad);
            assert_eq!(id.as_str().len(), 16, "{bad:?} -> {id}");
            assert!(id.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        }
        let long = id_for("y".repeat(MAX_LEN + 1).as_bytes());
        assert_eq!(long.as_str().len(), 16);
        assert_eq!(RequestId::for_request(&HeaderMap::new()).as_str().len(), 16);
        assert_ne!(RequestId::generate(), RequestId::generate());
    }
}
