//! The tools beside the server, built into the same binary: the admin API client (`join`,
//! `leave`, `status`, `watch`, `drain`, and `serve --join`), the load tool (`gateway bench`) and
//! the storm planner (`gateway plan-storm`). They reach a cluster only over its public and
//! cluster listeners: no server module (node, ws, api, cluster, raft, store) is imported here.

pub mod admin;
pub mod bench;
pub mod plan;
pub mod probe;
pub mod scale;

use std::path::PathBuf;

use clap::Args;

/// Where the CLI finds the cluster secret.
#[derive(Debug, Args, Clone)]
pub struct SecretArgs {
    /// File holding the cluster secret (trailing newline stripped).
    #[arg(long, env = "GATEWAY_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Data dir of a local node whose generated `cluster.secret` to use when no secret is given.
    #[arg(long, env = "GATEWAY_DATA_DIR", default_value = "gateway-data")]
    pub data_dir: PathBuf,
}
