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

/// A request's id: a caller's plain one, or 16 generated hex digits (kept as the number, so a
/// request that brings no id costs no allocation for it). `Debug` shows it as the log does.
#[derive(Clone, PartialEq, Eq)]
pub struct RequestId(Id);

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({self})")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Id {
    Generated(u64),
    Caller(Box<str>),
}

impl RequestId {
    /// The caller's `x-request-id` when it is acceptable, else a fresh one.
    pub fn for_request(headers: &HeaderMap) -> RequestId {
        match headers.get(&HEADER).map(HeaderValue::as_bytes) {
            Some(v) if acceptable(v) => RequestId(Id::Caller(String::from_utf8_lossy(v).into())),
            _ => RequestId::generate(),
        }
    }

    pub fn generate() -> RequestId {
        RequestId(Id::Generated(rand::random::<u64>()))
    }

    /// The id as a header value (it is plain ASCII by construction).
    pub fn header_value(&self) -> HeaderValue {
        let value = match &self.0 {
            Id::Generated(n) => HeaderValue::from_bytes(&hex(*n)),
            Id::Caller(s) => HeaderValue::from_str(s),
        };
        value.expect("request ids are plain ASCII")
    }
}

/// `n` as 16 lowercase hex digits.
fn hex(n: u64) -> [u8; 16] {
    let mut digits = [0u8; 16];
    for (i, d) in digits.iter_mut().enumerate() {
        *d = b"0123456789abcdef"[((n >> (60 - 4 * i)) & 0xf) as usize];
    }
    digits
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Id::Generated(n) => f.write_str(std::str::from_utf8(&hex(*n)).expect("hex digits are ASCII")),
            Id::Caller(s) => f.write_str(s),
        }
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
        assert_eq!(id_for(b"req-42_a.b").to_string(), "req-42_a.b");
        assert_eq!(id_for(b"req-42_a.b").header_value(), "req-42_a.b");
        assert_eq!(id_for("x".repeat(MAX_LEN).as_bytes()).to_string(), "x".repeat(MAX_LEN));
        for bad in [&b"<script>"[..], b"a b", b"Bearer abc", b"\xff\xfe", b"id\"}"] {
            let id = id_for(bad);
            assert_eq!(id.to_string().len(), 16, "{bad:?} -> {id}");
            assert!(id.to_string().bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(id.header_value(), id.to_string().as_str(), "the header and the log give one id");
        }
        let long = id_for("y".repeat(MAX_LEN + 1).as_bytes());
        assert_eq!(long.to_string().len(), 16);
        assert_eq!(RequestId::for_request(&HeaderMap::new()).to_string().len(), 16);
        assert_ne!(RequestId::generate(), RequestId::generate());
        assert_eq!(RequestId(Id::Generated(0x0123_4567_89ab_cdef)).header_value(), "0123456789abcdef");
        assert_eq!(RequestId(Id::Generated(0xa)).to_string(), "000000000000000a");
    }
}
