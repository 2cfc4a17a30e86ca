//! Device tokens: HS256 JWTs whose `sub` is the device id and `epoch` the install epoch. The
//! length is capped before any decoding (a megabyte token would otherwise cost milliseconds);
//! `alg: none`, other algorithms, expired and not-yet-valid (`nbf`) tokens and bad signatures are
//! refused, with a fixed message (never the token's content). Shared by the
//! device listener (verifying) and the tools that mint tokens (`gateway token`, the load tool).

use serde::{Deserialize, Serialize};

/// Longest token accepted; real ones are ~200 bytes.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// The claims of a device token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceClaims {
    pub sub: String,
    #[serde(default)]
    pub epoch: u64,
    pub exp: u64,
    /// Not valid before (Unix seconds), if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<u64>,
    /// The tenant the device belongs to, if any: its connections and publishes count against
    /// the tenant's quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Why a token was refused (all answered with 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no device token (Authorization: Bearer, or ?token=)")]
    Missing,
    #[error("token longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("token expired")]
    Expired,
    #[error("token not valid yet (nbf)")]
    NotYetValid,
    #[error("bad device id in token")]
    BadDevice,
    #[error("bad tenant in token (1-64 characters of [A-Za-z0-9._-])")]
    BadTenant,
    #[error("invalid token: {0}")]
    Invalid(String),
}

impl AuthError {
    /// The reason string in JSON bodies and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing_token",
            AuthError::TooLong => "token_too_long",
            AuthError::Expired => "token_expired",
            AuthError::NotYetValid => "token_not_yet_valid",
            AuthError::BadDevice => "bad_device_id",
            AuthError::BadTenant => "bad_tenant",
            AuthError::Invalid(_) => "invalid_token",
        }
    }
}

/// The longest device id, in bytes.
pub const MAX_DEVICE_ID: usize = 128;

/// Device ids: 1-[`MAX_DEVICE_ID`] bytes of `[A-Za-z0-9._:@-]`.
pub fn valid_device_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_DEVICE_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
}

/// Tenant names: 1-64 bytes of `[A-Za-z0-9._-]`.
pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Verifies tokens with the node's device secret.
#[derive(Clone)]
pub struct Verifier {
    key: jsonwebtoken::DecodingKey,
    validation: jsonwebtoken::Validation,
}

impl Verifier {
    pub fn new(secret: &[u8]) -> Verifier {
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.leeway = 5;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Verifier { key: jsonwebtoken::DecodingKey::from_secret(secret), validation }
    }

    pub fn verify(&self, token: &str) -> Result<DeviceClaims, AuthError> {
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        if token.len() > MAX_TOKEN_BYTES {
            return Err(AuthError::TooLong);
        }
        let data =
            jsonwebtoken::decode::<DeviceClaims>(token, &self.key, &self.validation).map_err(|e| refusal(e.kind()))?;
        if !valid_device_id(&data.claims.sub) {
            return Err(AuthError::BadDevice);
        }
        if data.claims.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
            return Err(AuthError::BadTenant);
        }
        Ok(data.claims)
    }
}

/// What a refused token is told: a fixed sentence per kind of failure. Decoding errors quote the
/// token's content (e.g. a claim of the wrong type), and a refusal never echoes client input.
fn refusal(kind: &jsonwebtoken::errors::ErrorKind) -> AuthError {
    use jsonwebtoken::errors::ErrorKind as K;
    let why = match kind {
        K::ExpiredSignature => return AuthError::Expired,
        K::ImmatureSignature => return AuthError::NotYetValid,
        K::InvalidSignature => "bad signature",
        K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => "algorithm not allowed (HS256 only)",
        K::MissingRequiredClaim(_) => "a required claim (sub, exp) is missing",
        K::Json(_) | K::Utf8(_) => "malformed claims",
        _ => "malformed token",
    };
    AuthError::Invalid(why.to_string())
}

/// Mints a token (`gateway token`, tests, the load tool).
pub fn mint(secret: &[u8], device: &str, epoch: u64, exp_unix_s: u64) -> Result<String, AuthError> {
    mint_claims(secret, &DeviceClaims { sub: device.to_string(), epoch, exp: exp_unix_s, nbf: None, tenant: None })
}

/// Mints a token carrying `claims` (a tenant, a not-before).
pub fn mint_claims(secret: &[u8], claims: &DeviceClaims) -> Result<String, AuthError> {
    if !valid_device_id(&claims.sub) {
        return Err(AuthError::BadDevice);
    }
    if claims.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
        return Err(AuthError::BadTenant);
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .map_err(|e| AuthError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn far() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600
    }

    fn b64(bytes: &[u8]) -> String {
        // URL-safe base64 without padding, enough for hand-built tokens.
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn accepts_a_minted_token() {
        let t = mint(SECRET, "d1", 7, far()).unwrap();
        let c = Verifier::new(SECRET).verify(&t).unwrap();
        assert_eq!((c.sub.as_str(), c.epoch), ("d1", 7));
    }

    #[test]
    fn refuses_bad_tokens() {
        let v = Verifier::new(SECRET);
        assert_eq!(v.verify(""), Err(AuthError::Missing));
        assert_eq!(v.verify(&"a".repeat(MAX_TOKEN_BYTES + 1)), Err(AuthError::TooLong));
        let other = mint(b"another-secret-of-enough-length!", "d1", 0, far()).unwrap();
        assert!(matches!(v.verify(&other), Err(AuthError::Invalid(_))));
        let expired = mint(SECRET, "d1", 0, 1_000).unwrap();
        assert_eq!(v.verify(&expired), Err(AuthError::Expired));
        assert!(matches!(v.verify("not.a.token"), Err(AuthError::Invalid(_))));
        // alg: none with an empty signature.
        let none = format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(format!(r#"{{"sub":"d1","exp":{}}}"#, far()).as_bytes())
        );
        assert!(matches!(v.verify(&none), Err(AuthError::Invalid(_))), "alg none must be refused");
        // A valid signature over an HS384 header is still the wrong algorithm.
        let hs384 = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS384),
            &DeviceClaims { sub: "d1".into(), epoch: 0, exp: far(), nbf: None, tenant: None },
            &jsonwebtoken::EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert!(matches!(v.verify(&hs384), Err(AuthError::Invalid(_))));
        assert_eq!(mint(SECRET, "bad id!", 0, far()), Err(AuthError::BadDevice));
        // Not valid before an hour from now.
        let early = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &DeviceClaims { sub: "d1".into(), epoch: 0, exp: far() + 3600, nbf: Some(far()), tenant: None },
            &jsonwebtoken::EncodingKey::from_secret(SECRET),
        )
        .unwrap();
        assert_eq!(v.verify(&early), Err(AuthError::NotYetValid));
    }

    #[test]
    fn refusals_never_quote_the_token() {
        let v = Verifier::new(SECRET);
        // A claim of the wrong type: serde's message would quote it.
        let marker = "SECRET-LOOKING-CONTENT";
        let wrong = format!(
            "{}.{}.sig",
            b64(br#"{"alg":"HS256","typ":"JWT"}"#),
            b64(format!(r#"{{"sub":1,"exp":"{marker}"}}"#).as_bytes())
        );
        let bogus = format!("{marker}.{marker}.{marker}");
        for t in [wrong.as_str(), bogus.as_str(), "a.b.c"] {
            let e = v.verify(t).unwrap_err().to_string();
            assert!(!e.contains(marker) && !e.contains(t), "{e}");
        }
    }
}
