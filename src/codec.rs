//! The only place that names bincode: every persisted or wire value is one version byte followed by
//! its bincode-2 (serde) encoding. Leaf module: imports nothing of the crate.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Version byte written in front of every encoded value. Bump it (and keep a decoder for the old
/// layout) whenever a persisted type changes shape: bincode is not self-describing.
pub const VERSION: u8 = 1;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty value")]
    Empty,
    #[error("unsupported encoding version {0} (this build reads version {VERSION})")]
    Version(u8),
    #[error("decode: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    #[error("encode: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    #[error("{0} trailing bytes after value")]
    Trailing(usize),
    #[error("a length of {0} bytes runs past the end of the value")]
    PastEnd(u64),
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// A vector bincode writes into: each field's few bytes appended in place. bincode's
/// `std::io::Write` adapter went through `write_all` for every field, and an encoding of a log
/// entry writes a few per command.
struct Appender<'a>(&'a mut Vec<u8>);

impl bincode::enc::write::Writer for Appender<'_> {
    #[inline]
    fn write(&mut self, bytes: &[u8]) -> Result<(), bincode::error::EncodeError> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }
}

/// The capacity an encoding starts at: a device row, a lease, a reply or a lone command fits, so
/// that most encodings are made without growing the vector (grown from the version byte, a device
/// row's reallocated three times).
const FIRST_CAPACITY: usize = 64;

/// Encodes `value` as `[VERSION, bincode...]`.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(FIRST_CAPACITY);
    out.push(VERSION);
    bincode::serde::encode_into_writer(value, Appender(&mut out), config())?;
    Ok(out)
}

/// Decodes a value written by [`encode`], refusing unknown versions and trailing garbage.
///
/// What a decode may claim (bincode counts every value's in-memory size, and a string's or
/// buffer's length before allocating it) is bounded by the input's length: 16 times it (a one-byte
/// varint can stand for a 16-byte integer), in tiers. So a length prefix of a few bytes cannot make
/// the node allocate a terabyte (an abort) or gigabytes; inputs over 64 MiB (a snapshot assembled
/// from the leader's chunks) are not bounded.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let body = versioned(bytes)?;
    let (value, used) = decode_first(body)?;
    if used != body.len() {
        return Err(CodecError::Trailing(body.len() - used));
    }
    Ok(value)
}

/// The bytes after the version byte, if it is this build's.
pub fn versioned(bytes: &[u8]) -> Result<&[u8], CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != VERSION {
        return Err(CodecError::Version(version));
    }
    Ok(body)
}

/// The value at the start of `body` and the bytes it used, bounded as [`decode`] says.
fn decode_first<T: DeserializeOwned>(body: &[u8]) -> Result<(T, usize), CodecError> {
    let c = config();
    Ok(match body.len() {
        n if n <= 4 << 10 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 64 << 10 }>())?,
        n if n <= 64 << 10 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 1 << 20 }>())?,
        n if n <= 1 << 20 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 16 << 20 }>())?,
        n if n <= 64 << 20 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 1 << 30 }>())?,
        _ => bincode::serde::decode_from_slice(body, c)?,
    })
}

/// Bulk bytes after a small head: the same bytes as `encode(&(head, bytes))`, written with one
/// copy of `bytes` where serde would hand bincode a sequence one byte at a time. [`decode_with_bytes`]
/// reads either. The node writes these bytes in place, from [`head_for_bytes`] (the kept snapshot
/// in `store::kept`, the snapshot RPC in `raft::network::snapshot_body`); this is what tests check
/// those writers against.
#[cfg(test)]
pub fn encode_with_bytes<T: Serialize + ?Sized>(head: &T, bytes: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut out = head_for_bytes(head, bytes.len())?;
    out.reserve_exact(bytes.len());
    out.extend_from_slice(bytes);
    Ok(out)
}

/// What [`encode_with_bytes`] writes before the bytes themselves, for a writer that copies those
/// straight to where they go (`len` of them).
pub fn head_for_bytes<T: Serialize + ?Sized>(head: &T, len: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = encode(head)?;
    put_len(&mut out, len);
    Ok(out)
}

/// Reads what [`encode_with_bytes`] (or `encode(&(head, bytes))`) wrote: the head, and the bytes
/// borrowed from `bytes`; trailing bytes are refused as [`decode`] refuses them.
pub fn decode_with_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, &[u8]), CodecError> {
    let body = versioned(bytes)?;
    let (head, used) = decode_first(body)?;
    let mut rest = Reader::new(&body[used..]);
    let tail = rest.next_bytes()?;
    rest.finish()?;
    Ok((head, tail))
}

/// Appends a length as bincode writes one before a string or a sequence.
pub fn put_len(out: &mut Vec<u8>, len: usize) {
    // A `Vec` takes every write; `usize` → `u64` is lossless on every target Rust supports here.
    let _ = bincode::encode_into_writer(len as u64, Appender(out), config());
}

/// Appends `bytes` as bincode writes a string or a `Vec<u8>`: its length, then the bytes.
pub fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Reads, without copying, what [`put_len`] and [`put_bytes`] wrote; a length past the end of
/// the input is an error, never a panic or an allocation.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    /// The input not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub fn next_len(&mut self) -> Result<u64, CodecError> {
        let (len, used): (u64, usize) = bincode::decode_from_slice(self.rest, config())?;
        self.rest = &self.rest[used..];
        Ok(len)
    }

    pub fn next_bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let len = self.next_len()?;
        let n = usize::try_from(len).ok().filter(|&n| n <= self.rest.len()).ok_or(CodecError::PastEnd(len))?;
        let (bytes, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(bytes)
    }

    /// Refuses what is left, as [`decode`] refuses trailing bytes.
    pub fn finish(&self) -> Result<(), CodecError> {
        match self.rest.len() {
            0 => Ok(()),
            n => Err(CodecError::Trailing(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let v = (7u64, String::from("d1"), vec![1u8, 2, 3]);
        let bytes = encode(&v).unwrap();
        assert_eq!(bytes[0], VERSION);
        assert_eq!(decode::<(u64, String, Vec<u8>)>(&bytes).unwrap(), v);
        assert!(matches!(decode::<u64>(&[]), Err(CodecError::Empty)));
        let mut wrong = bytes.clone();
        wrong[0] = 99;
        assert!(matches!(decode::<(u64, String, Vec<u8>)>(&wrong), Err(CodecError::Version(99))));
        let mut long = bytes;
        long.push(0);
        assert!(matches!(decode::<(u64, String, Vec<u8>)>(&long), Err(CodecError::Trailing(1))));
    }

    #[test]
    fn an_encoding_is_what_bincode_writes_after_the_version_byte() {
        // Values from a device row's size to a large log entry's: the appender writes bincode's
        // own bytes, and a large value grows the vector as bincode's own writer does.
        for len in [0, 5, 40, 700, 70_000] {
            let v = (len as u64, "d".repeat(len), vec![3u64; len / 8], Some(-1i32));
            let bytes = encode(&v).unwrap();
            let theirs = bincode::serde::encode_to_vec(&v, config()).unwrap();
            assert_eq!((bytes[0], &bytes[1..]), (VERSION, &theirs[..]), "a value of {} bytes", theirs.len());
            let (cap, len) = (bytes.capacity(), bytes.len());
            assert!(cap <= (2 * len).max(FIRST_CAPACITY), "capacity {cap} for {len} bytes");
            assert_eq!(decode::<(u64, String, Vec<u64>, Option<i32>)>(&bytes).unwrap(), v);
        }
        for len in [0, 250, 251, 65_535, 65_536, 1 << 32] {
            let mut out = Vec::new();
            put_len(&mut out, len);
            assert_eq!(out, bincode::encode_to_vec(len as u64, config()).unwrap(), "length {len}");
        }
    }

    #[test]
    fn bulk_bytes_after_a_head_are_what_serde_writes_and_read_either_way() {
        let head = (3u64, String::from("meta"));
        for len in [0, 1, 250, 251, 65_535, 65_536, 1 << 20] {
            let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let serde = encode(&(&head, &bytes)).unwrap();
            assert_eq!(encode_with_bytes(&head, &bytes).unwrap(), serde, "{len} bytes");
            let (h, b) = decode_with_bytes::<(u64, String)>(&serde).unwrap();
            assert_eq!((h, b), (head.clone(), &bytes[..]));
            let mut out = Vec::new();
            put_bytes(&mut out, &bytes);
            assert_eq!(out, serde[encode(&head).unwrap().len()..], "{len} bytes");
        }
        let good = encode_with_bytes(&head, b"abc").unwrap();
        let mut long = good.clone();
        long.push(0);
        assert!(matches!(decode_with_bytes::<(u64, String)>(&long), Err(CodecError::Trailing(1))));
        assert!(matches!(decode_with_bytes::<(u64, String)>(&good[..good.len() - 1]), Err(CodecError::PastEnd(3))));
        let mut r = Reader::new(&[0xFD, 0, 0, 0, 0, 0, 0, 0, 0x80]);
        assert!(matches!(r.next_bytes(), Err(CodecError::PastEnd(_))), "a length of 2^63 is an error");
    }

    #[test]
    fn a_length_prefix_cannot_claim_more_than_the_input_allows() {
        // A string of 2^40 bytes (8-byte length marker 0xFD): the process aborted allocating it;
        // 2^63 panicked with a capacity overflow; 2^24 (4-byte marker 0xFC) allocated 16 MiB.
        for bytes in [
            vec![VERSION, 0xFD, 0, 0, 0, 0, 0, 1, 0, 0],
            vec![VERSION, 0xFD, 0, 0, 0, 0, 0, 0, 0, 0x80],
            vec![VERSION, 0xFC, 0, 0, 0, 1],
        ] {
            let e = decode::<String>(&bytes).unwrap_err();
            assert!(matches!(e, CodecError::Decode(bincode::error::DecodeError::LimitExceeded)), "{e}");
        }
        // Values as large as their tier still decode.
        for len in [4000, 60_000, 1_000_000, 3 << 20] {
            let big = "x".repeat(len);
            assert_eq!(decode::<String>(&encode(&big).unwrap()).unwrap(), big);
            let many: Vec<u64> = (0..len as u64 / 8).collect();
            assert_eq!(decode::<Vec<u64>>(&encode(&many).unwrap()).unwrap(), many);
        }
    }
}
