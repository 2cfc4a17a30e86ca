//! The TLS section: which PEM files each listener serves and whether members verify each other
//! by certificate. Paths only: the files are read (and re-read on reload) by `crate::tls`.

use std::path::PathBuf;

use super::{ConfigError, FileConfig};

/// A certificate chain and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// TLS between members and on the cluster listener (Raft RPC, admin API, publishes, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTls {
    pub files: CertFiles,
    /// The CA (PEM, one or more certificates) peers' certificates must chain to.
    pub ca: PathBuf,
    /// Mutual TLS: the cluster listener refuses a client without a certificate from `ca`; the
    /// node presents its own certificate when it dials a peer.
    pub client_auth: bool,
}

/// Both listeners' TLS; `None` serves plain text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// The device listener (`wss://`).
    pub device: Option<CertFiles>,
    /// The cluster listener and the node's outbound calls (`https://`).
    pub cluster: Option<ClusterTls>,
}

impl TlsConfig {
    /// Merges the TLS keys of `flags` over `file`; refuses half-configured pairs.
    pub(super) fn merge(flags: &FileConfig, file: &FileConfig) -> Result<TlsConfig, ConfigError> {
        let pick = |a: &Option<PathBuf>, b: &Option<PathBuf>| a.clone().or_else(|| b.clone());
        let bad = |m: &str| Err(ConfigError::Invalid(m.into()));
        let device =
            match (pick(&flags.tls_cert_file, &file.tls_cert_file), pick(&flags.tls_key_file, &file.tls_key_file)) {
                (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
                (None, None) => None,
                (Some(_), None) => return bad("tls_cert_file needs tls_key_file (--tls-key-file)"),
                (None, Some(_)) => return bad("tls_key_file needs tls_cert_file (--tls-cert-file)"),
            };
        let cert = pick(&flags.cluster_tls_cert_file, &file.cluster_tls_cert_file);
        let key = pick(&flags.cluster_tls_key_file, &file.cluster_tls_key_file);
        let ca = pick(&flags.cluster_tls_ca_file, &file.cluster_tls_ca_file);
        let client_auth = flags.cluster_tls_client_auth.or(file.cluster_tls_client_auth).unwrap_or(false);
        let cluster = match (cert, key, ca) {
            (Some(cert), Some(key), Some(ca)) => Some(ClusterTls { files: CertFiles { cert, key }, ca, client_auth }),
            (None, None, None) if client_auth => {
                return bad("cluster_tls_client_auth needs cluster TLS (--cluster-tls-cert-file, --cluster-tls-key-file, --cluster-tls-ca-file)")
            }
            (None, None, None) => None,
            (None, _, _) => return bad("cluster TLS needs cluster_tls_cert_file (--cluster-tls-cert-file)"),
            (_, None, _) => return bad("cluster TLS needs cluster_tls_key_file (--cluster-tls-key-file)"),
            (_, _, None) => {
                return bad("cluster TLS needs cluster_tls_ca_file (--cluster-tls-ca-file): members verify each other against it")
            }
        };
        Ok(TlsConfig { device, cluster })
    }

    /// The TLS keys of the file format, as [`TlsConfig::merge`] would read them back.
    pub(super) fn fill(&self, out: &mut FileConfig) {
        out.tls_cert_file = self.device.as_ref().map(|d| d.cert.clone());
        out.tls_key_file = self.device.as_ref().map(|d| d.key.clone());
        out.cluster_tls_cert_file = self.cluster.as_ref().map(|c| c.files.cert.clone());
        out.cluster_tls_key_file = self.cluster.as_ref().map(|c| c.files.key.clone());
        out.cluster_tls_ca_file = self.cluster.as_ref().map(|c| c.ca.clone());
        out.cluster_tls_client_auth = Some(self.cluster.as_ref().is_some_and(|c| c.client_auth));
    }
}
