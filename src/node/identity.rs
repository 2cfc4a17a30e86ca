//! A node's identity, kept in its data dir. The Raft id is random and generated when the data dir
//! is first created, so a wiped node can never rejoin under an old id.

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
}
