//! The tools beside the server, built into the same binary: the admin API client (`join`,
//! `leave`, `status`, `watch`, `drain`, and `serve --join`), the bootstrap guard (`serve --peers`), the load tool (`gateway bench`) and
//! the storm planner (`gateway plan-storm`). They reach a cluster only over its public and
//! cluster listeners: no server module (node, ws, api, cluster, raft, store) is imported here.

pub mod admin;
pub mod bench;
pub mod bootguard;
pub mod plan;
pub mod probe;
pub mod scale;

use std::path::PathBuf;

use clap::Args;

/// Where the CLI finds the cluster secret, and how it speaks TLS to a cluster listener.
#[derive(Debug, Args, Clone)]
pub struct SecretArgs {
    /// File holding the cluster secret (trailing newline stripped).
    #[arg(long, env = "GATEWAY_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Data dir of a local node whose generated `cluster.secret` to use when no secret is given.
    #[arg(long, env = "GATEWAY_DATA_DIR", default_value = "gateway-data")]
    pub data_dir: PathBuf,
    /// CA certificates (PEM) to trust for https:// cluster listeners; host:port addresses are
    /// then dialled with https.
    #[arg(long, env = "GATEWAY_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) to present to a cluster listener that requires one (mutual TLS).
    #[arg(long, env = "GATEWAY_CLIENT_CERT_FILE", requires_all = ["client_key_file", "ca_file"])]
    pub client_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --client-cert-file.
    #[arg(long, env = "GATEWAY_CLIENT_KEY_FILE", requires = "client_cert_file")]
    pub client_key_file: Option<PathBuf>,
}

impl SecretArgs {
    /// The TLS client configuration these flags ask for (`None`: plain text).
    pub fn tls(&self) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, crate::tls::TlsError> {
        let Some(ca) = &self.ca_file else { return Ok(None) };
        let identity = match (&self.client_cert_file, &self.client_key_file) {
            (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        crate::tls::client_config(ca, identity).map(Some)
    }
}
