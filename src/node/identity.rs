//! A node's identity, kept in its data dir. The Raft id is random and generated when the data dir
//! is first created, so a wiped node can never rejoin under an old id.

use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::NodeError;

const IDENTITY_FILE: &str = "node.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub id: u64,
    pub name: String,
}

/// Creates the data dir (and missing parents) readable by its owner only: it holds the secrets.
/// A refusal names the path; a file in its place is `not a directory`, not the `File exists`
/// that making a directory over it says.
pub fn create_data_dir(dir: &Path) -> Result<(), NodeError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| {
        let why = if dir.exists() && !dir.is_dir() { "not a directory".to_string() } else { e.to_string() };
        NodeError::Config(format!("data dir {}: {why}", dir.display()))
    })
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
            // Durable before it is used: a node must never come back under another id.
            let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(&ident).expect("plain struct"))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(dir)?.sync_all()?;
            Ok((ident, true))
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/data");
        create_data_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        create_data_dir(&dir).unwrap();
    }

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
}
