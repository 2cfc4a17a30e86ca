//! Secrets from the environment, a file, or the data dir (generated there with mode 0600 on a
//! node's first start): the cluster secret (Raft RPC, admin API), the device-token secret and the
//! backend secrets (publish and route reads only).
//! Used by the node and by the command-line tools; a secret is raw bytes, a trailing newline
//! stripped, at least 16 printable ASCII characters.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::RngCore;
use subtle::ConstantTimeEq;

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
            let hex = generate(&path)?;
            Ok((hex, path.display().to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// Where [`secret`] would take this secret from, checked the same way but never generated and
/// never returned (`gateway check-config`): `$VAR`, a file, or the data dir's file (which a first
/// start generates when it is missing).
pub fn inspect(env_var: &str, file: Option<&Path>, dir: &Path, generated_name: &str) -> Result<String, SecretError> {
    if let Ok(v) = std::env::var(env_var) {
        check(trim(v.into_bytes()), env_var)?;
        return Ok(format!("${env_var}"));
    }
    let path = file.map_or_else(|| dir.join(generated_name), Path::to_path_buf);
    match std::fs::read(&path) {
        Ok(bytes) => check(trim(bytes), &path.display().to_string()).map(|_| path.display().to_string()),
        Err(e) if file.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(format!("{} (generated on first start)", path.display()))
        }
        Err(e) => Err(SecretError(format!("cannot read secret file {}: {e}", path.display()))),
    }
}

/// [`inspect`] for the backend secrets ([`BackendSecrets::load`]'s sources and rules).
pub fn inspect_backend(file: Option<&Path>, dir: &Path) -> Result<String, SecretError> {
    const ENV: &str = "GATEWAY_BACKEND_SECRET";
    if let Ok(v) = std::env::var(ENV) {
        let keys = parse_backend(v.replace(',', "\n").as_bytes(), &format!("${ENV}"))?;
        return Ok(format!("${ENV} ({} secrets)", keys.len()));
    }
    let path = file.map_or_else(|| dir.join("backend.secret"), Path::to_path_buf);
    if file.is_none() && !path.exists() {
        return Ok(format!("{} (generated on first start)", path.display()));
    }
    Ok(format!("{} ({} secrets)", path.display(), read_backend(&path)?.len()))
}

/// Writes a fresh random secret (64 hex characters) to `path`, mode 0600, durably.
fn generate(path: &Path) -> Result<Vec<u8>, SecretError> {
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(hex.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    tracing::info!(path = %path.display(), "generated a secret (mode 0600)");
    Ok(hex.into_bytes())
}

/// At most this many backend secrets are accepted at once: the one in use and the next one,
/// while backends roll over.
pub const MAX_BACKEND_SECRETS: usize = 2;

/// How often a backend secret file is read again (rotation without a restart).
const BACKEND_RELOAD: Duration = Duration::from_secs(1);

/// The backend credentials: bearer secrets that may publish and read routes, and nothing else
/// (never Raft RPC, membership or admin). One or two of them, one per line, so that a rotation
/// overlaps: add the new line, move the backends over, remove the old line. A file is read again
/// at most once a second when a backend calls; an unusable new content keeps the previous
/// secrets (and says so in the log).
pub struct BackendSecrets {
    file: Option<PathBuf>,
    state: Mutex<(Vec<Vec<u8>>, Instant)>,
}

impl BackendSecrets {
    /// From `$GATEWAY_BACKEND_SECRET` (secrets separated by commas; fixed), the file flag, or the
    /// data dir's `backend.secret` (generated on first start); returns where they came from too.
    pub fn load(file: Option<&Path>, dir: &Path) -> Result<(BackendSecrets, String), SecretError> {
        const ENV: &str = "GATEWAY_BACKEND_SECRET";
        if let Ok(v) = std::env::var(ENV) {
            let keys = parse_backend(v.replace(',', "\n").as_bytes(), &format!("${ENV}"))?;
            return Ok((BackendSecrets::fixed(keys), format!("${ENV}")));
        }
        let path = file.map_or_else(|| dir.join("backend.secret"), Path::to_path_buf);
        if file.is_none() && !path.exists() {
            generate(&path)?;
        }
        let keys = read_backend(&path)?;
        let secrets = BackendSecrets { file: Some(path.clone()), state: Mutex::new((keys, Instant::now())) };
        Ok((secrets, path.display().to_string()))
    }

    /// Secrets that never change (tests, the environment).
    pub fn fixed(keys: Vec<Vec<u8>>) -> BackendSecrets {
        BackendSecrets { file: None, state: Mutex::new((keys, Instant::now())) }
    }

    /// Whether `token` is one of the backend secrets (constant time per secret).
    pub fn accepts(&self, token: &[u8]) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = self.file.as_deref().filter(|_| state.1.elapsed() >= BACKEND_RELOAD) {
            state.1 = Instant::now();
            match read_backend(path) {
                Ok(keys) if keys != state.0 => {
                    tracing::info!(path = %path.display(), secrets = keys.len(), "backend secrets reloaded");
                    state.0 = keys;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "kept the previous backend secrets"),
            }
        }
        state.0.iter().fold(false, |hit, k| hit | bool::from(token.ct_eq(k)))
    }
}

fn read_backend(path: &Path) -> Result<Vec<Vec<u8>>, SecretError> {
    let bytes = std::fs::read(path)
        .map_err(|e| SecretError(format!("cannot read backend secret file {}: {e}", path.display())))?;
    parse_backend(&bytes, &path.display().to_string())
}

/// One secret per line (blank lines and `#` comments skipped), one or two of them.
fn parse_backend(bytes: &[u8], source: &str) -> Result<Vec<Vec<u8>>, SecretError> {
    let keys = bytes
        .split(|b| *b == b'\n')
        .map(|line| trim(line.to_vec()))
        .filter(|line| !line.is_empty() && !line.starts_with(b"#"))
        .map(|line| check(line, source))
        .collect::<Result<Vec<_>, _>>()?;
    if !(1..=MAX_BACKEND_SECRETS).contains(&keys.len()) {
        return Err(SecretError(format!(
            "{source} must hold 1 to {MAX_BACKEND_SECRETS} backend secrets, one per line (it holds {})",
            keys.len()
        )));
    }
    Ok(keys)
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

    #[test]
    fn backend_secrets_hold_one_or_two_and_never_a_bad_one() {
        let (a, b) = ("a".repeat(16), "b".repeat(16));
        assert_eq!(parse_backend(format!("# rotation\n{a}\r\n\n{b}\n").as_bytes(), "f").unwrap().len(), 2);
        assert!(parse_backend(b"\n# nothing\n", "f").is_err());
        assert!(parse_backend(format!("{a}\n{b}\n{a}").as_bytes(), "f").is_err());
        assert!(parse_backend(format!("{a}\nshort").as_bytes(), "f").is_err());
        let s = BackendSecrets::fixed(vec![a.clone().into_bytes()]);
        assert!(s.accepts(a.as_bytes()));
        assert!(!s.accepts(b.as_bytes()) && !s.accepts(&a.as_bytes()[..15]) && !s.accepts(b""));
    }
}
