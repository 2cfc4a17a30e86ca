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
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != VERSION {
        return Err(CodecError::Version(version));
    }
    let (value, used) = bincode::serde::decode_from_slice(body, config())?;
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
}
