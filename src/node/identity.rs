//! A node's identity and secrets, kept in its data dir. The Raft id is random and generated when
//! the data dir is first created, so a wiped node can never rejoin under an old id.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::NodeError;

const IDENTITY_FILE: &str = "node.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub id: u64,
    pub name: String,
}

/// Loads the identity in `dir`, or creates one; `true` when it was created now (a fresh data dir).
pub fn load_or_create(dir: &Path, name: Option<&str>) -> Result<(Identity, bool), NodeError> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let id: Identity = serde_json::from_slice(&bytes)
                .map_err(|e| NodeError::Config(format!("{}: unreadable identity: {e}", path.display())))?;
            if let Some(n) = name.filter(|n| *n != id.name) {
                return Err(NodeError::Config(format!(
                    "data dir {} belongs to node {:?} (id {}); --name {n:?} differs: drop --name or use another data dir",
                    dir.display(),
                    id.name,
                    id.id
                )));
            }
            Ok((id, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut id = rand::thread_rng().next_u64();
            while id == 0 {
                id = rand::thread_rng().next_u64();
            }
            let name = name.map_or_else(|| format!("node-{:06x}", id & 0xff_ffff), str::to_string);
            let ident = Identity { id, name };
            let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
            std::fs::write(&tmp, serde_json::to_vec_pretty(&ident).expect("plain struct"))?;
            std::fs::rename(&tmp, &path)?;
            Ok((ident, true))
        }
        Err(e) => Err(e.into()),
    }
}

/// Where a secret comes from, in order: the environment variable (the secret itself), the file
/// flag, the data dir's generated file; otherwise one is generated there (mode 0600).
pub fn secret(
    env_var: &str,
    file: Option<&Path>,
    dir: &Path,
    generated_name: &str,
) -> Result<(Vec<u8>, String), NodeError> {
    if let Ok(v) = std::env::var(env_var) {
        return Ok((check(trim(v.into_bytes()), env_var)?, format!("${env_var}")));
    }
    if let Some(f) = file {
        let bytes =
            std::fs::read(f).map_err(|e| NodeError::Config(format!("cannot read secret file {}: {e}", f.display())))?;
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
pub fn cli_cluster_secret(file: Option<&Path>, dir: &Path) -> Result<Vec<u8>, NodeError> {
    cli_secret("GATEWAY_CLUSTER_SECRET", "--cluster-secret-file", file, &dir.join("cluster.secret"))
}

/// Reads the device secret for `gateway token`, the same way.
pub fn cli_device_secret(file: Option<&Path>, dir: &Path) -> Result<Vec<u8>, NodeError> {
    cli_secret("GATEWAY_DEVICE_SECRET", "--device-secret-file", file, &dir.join("device.secret"))
}

fn cli_secret(env_var: &str, flag: &str, file: Option<&Path>, generated: &Path) -> Result<Vec<u8>, NodeError> {
    if let Ok(v) = std::env::var(env_var) {
        return check(trim(v.into_bytes()), env_var);
    }
    let path = file.unwrap_or(generated);
    let bytes = std::fs::read(path).map_err(|e| {
        NodeError::Config(format!("cannot read the secret {}: {e} (pass {flag} or set {env_var})", path.display()))
    })?;
    check(trim(bytes), &path.display().to_string())
}

fn trim(mut bytes: Vec<u8>) -> Vec<u8> {
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    bytes
}

fn check(bytes: Vec<u8>, source: &str) -> Result<Vec<u8>, NodeError> {
    if bytes.len() < 16 || !bytes.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(NodeError::Config(format!(
            "secret from {source} must be at least 16 printable ASCII characters without spaces"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (a, fresh) = load_or_create(dir.path(), Some("n1")).unwrap();
        assert!(fresh);
        let (b, fresh) = load_or_create(dir.path(), None).unwrap();
        assert!(!fresh);
        assert_eq!((a.id, a.name.as_str()), (b.id, "n1"));
        assert!(load_or_create(dir.path(), Some("other")).is_err());
    }

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
