//! Secrets from the environment, a file, or the data dir (generated there with mode 0600 on a
//! node's first start): the cluster secret (Raft RPC, admin API) and the device-token secret.
//! Used by the node and by the command-line tools; a secret is raw bytes, a trailing newline
//! stripped, at least 16 printable ASCII characters.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;

/// A secret that cannot be read or is unusable (a configuration error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SecretError(pub String);

impl From<std::io::Error> for SecretError {
    fn from(e: std::io::Error) -> Self {
        SecretError(e.to_string())
    }
}

/// Where a secret comes from, in order: the environment variable (the secret itself), the file
/// flag, the data dir's generated file; otherwise one is generated there (mode 0600).
pub fn secret(
    env_var: &str,
    file: Option<&Path>,
    dir: &Path,
    generated_name: &str,
) -> Result<(Vec<u8>, String), SecretError> {
    if let Ok(v) = std::env::var(env_var) {
        return Ok((check(trim(v.into_bytes()), env_var)?, format!("${env_var}")));
    }
    if let Some(f) = file {
        let bytes =
            std::fs::read(f).map_err(|e| SecretError(format!("cannot read secret file {}: {e}", f.display())))?;
        return Ok((check(trim(bytes), &f.display().to_string())?, f.display().to_string()));
    }
    let path: PathBuf = dir.join(generated_name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok((check(trim(bytes), &path.display().to_string())?, path.display().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut raw = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut raw);
            let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
            f.write_all(hex.as_bytes())?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            tracing::info!(path = %path.display(), "generated a secret (mode 0600)");
            Ok((hex.into_bytes(), path.display().to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Reads the cluster secret for the CLI: `$GATEWAY_CLUSTER_SECRET`, the file, or the data dir's generated one.
pub fn cli_cluster_secret(file: Option<&Path>, dir: &Path) -> Result<Vec<u8>, SecretError> {
    cli_secret("GATEWAY_CLUSTER_SECRET", "--cluster-secret-file", file, &dir.join("cluster.secret"))
}

/// Reads the device secret for `gateway token`, the same way.
pub fn cli_device_secret(file: Option<&Path>, dir: &Path) -> Result<Vec<u8>, SecretError> {
    cli_secret("GATEWAY_DEVICE_SECRET", "--device-secret-file", file, &dir.join("device.secret"))
}

fn cli_secret(env_var: &str, flag: &str, file: Option<&Path>, generated: &Path) -> Result<Vec<u8>, SecretError> {
    if let Ok(v) = std::env::var(env_var) {
        return check(trim(v.into_bytes()), env_var);
    }
    let path = file.unwrap_or(generated);
    let bytes = std::fs::read(path).map_err(|e| {
        SecretError(format!("cannot read the secret {}: {e} (pass {flag} or set {env_var})", path.display()))
    })?;
    check(trim(bytes), &path.display().to_string())
}

fn trim(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    bytes
}

fn check(bytes: Vec<u8>, source: &str) -> Result<Vec<u8>, SecretError> {
    if bytes.len() < 16 || !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(SecretError(format!(
            "secret from {source} must be at least 16 printable ASCII characters without spaces"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secret_is_private_and_stable() {
        let dir = tempfile::tempdir().unwrap();
        let (s1, _) = secret("GATEWAY_TEST_UNSET_SECRET", None, dir.path(), "cluster.secret").unwrap();
        let mode = std::fs::metadata(dir.path().join("cluster.secret")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (s2, _) = secret("GATEWAY_TEST_UNSET_SECRET", None, dir.path(), "cluster.secret").unwrap();
        assert_eq!(s1, s2);
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        assert!(secret("GATEWAY_TEST_UNSET_SECRET", Some(&short), dir.path(), "x").is_err());
    }
}
