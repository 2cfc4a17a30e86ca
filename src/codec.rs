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
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// Encodes `value` as `[VERSION, bincode...]`.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())?;
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
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != VERSION {
        return Err(CodecError::Version(version));
    }
    let c = config();
    let (value, used) = match body.len() {
        n if n <= 4 << 10 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 64 << 10 }>())?,
        n if n <= 64 << 10 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 1 << 20 }>())?,
        n if n <= 1 << 20 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 16 << 20 }>())?,
        n if n <= 64 << 20 => bincode::serde::decode_from_slice(body, c.with_limit::<{ 1 << 30 }>())?,
        _ => bincode::serde::decode_from_slice(body, c)?,
    };
    if used != body.len() {
        return Err(CodecError::Trailing(body.len() - used));
    }
    Ok(value)
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
