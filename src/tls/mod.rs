//! TLS with rustls (ring provider): PEM files → server and client configurations. A listener's
//! [`ServerTls`] re-reads its files on [`ServerTls::reload`] (SIGHUP or a changed file, see
//! [`reload`]) and swaps the configuration new handshakes use; open connections keep theirs. A
//! refused reload leaves the old certificate in use. Key material stays inside rustls' types and
//! is never logged: errors name files, never their contents.

pub mod reload;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::config::tls::{CertFiles, ClusterTls};

/// Why TLS files could not be used. Names the file and the problem, never its contents.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{what} {path}: not PEM ({reason})")]
    Pem { what: &'static str, path: PathBuf, reason: String },
    #[error("{what} {path}: no {kind} in it")]
    Empty { what: &'static str, path: PathBuf, kind: &'static str },
    #[error("certificate {cert} with key {key}: {reason}")]
    Key { cert: PathBuf, key: PathBuf, reason: String },
    #[error("CA file {path}: {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The one crypto provider (ring: builds statically, no cmake or assembler toolchain).
pub fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.into(), source })
}

/// Every certificate in a PEM file (a chain: leaf first).
pub fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::Pem {
        what,
        path: path.into(),
        reason: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::Empty { what, path: path.into(), kind: "CERTIFICATE" });
    }
    Ok(certs)
}

/// A certificate chain and its key, checked to belong together.
pub fn load_identity(files: &CertFiles) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = load_certs("certificate file", &files.cert)?;
    let pem = read("key file", &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            TlsError::Empty { what: "key file", path: files.key.clone(), kind: "PRIVATE KEY" }
        }
        e => TlsError::Pem { what: "key file", path: files.key.clone(), reason: e.to_string() },
    })?;
    let key_error = |reason: String| TlsError::Key { cert: files.cert.clone(), key: files.key.clone(), reason };
    CertifiedKey::from_der(chain, key, &provider()).map(Arc::new).map_err(|e| key_error(e.to_string()))
}

/// The CA certificates of a PEM file as a root store.
pub fn load_roots(path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs("CA file", path)? {
        roots.add(cert).map_err(|e| TlsError::Ca { path: path.into(), reason: e.to_string() })?;
    }
    Ok(Arc::new(roots))
}

/// What a listener serves: its certificate and, for mutual TLS, the CA its clients must chain to.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    pub files: CertFiles,
    /// The CA file (re-read on reload); with `client_auth`, clients must present a certificate from it.
    pub ca: Option<PathBuf>,
    pub client_auth: bool,
}

impl ServerFiles {
    pub fn device(files: &CertFiles) -> ServerFiles {
        ServerFiles { files: files.clone(), ca: None, client_auth: false }
    }

    pub fn cluster(c: &ClusterTls) -> ServerFiles {
        ServerFiles { files: c.files.clone(), ca: Some(c.ca.clone()), client_auth: c.client_auth }
    }

    fn paths(&self) -> Vec<PathBuf> {
        let mut p = vec![self.files.cert.clone(), self.files.key.clone()];
        p.extend(self.ca.clone());
        p
    }
}

/// Everything read from a listener's files at one load.
struct Loaded {
    server: Arc<ServerConfig>,
    identity: Arc<CertifiedKey>,
    roots: Option<Arc<RootCertStore>>,
}

fn load(files: &ServerFiles) -> Result<Loaded, TlsError> {
    let identity = load_identity(&files.files)?;
    let roots = files.ca.as_deref().map(load_roots).transpose()?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match (&roots, files.client_auth) {
        (Some(roots), true) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut server = builder.with_cert_resolver(Arc::new(Fixed(identity.clone())));
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Loaded { server: Arc::new(server), identity, roots })
}

/// A file's identity for change detection: modification time, length and inode (a rename over
/// it changes the inode), or `None` when it cannot be read.
type Stamp = Vec<Option<(std::time::SystemTime, u64, u64)>>;

fn stamp(paths: &[PathBuf]) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    paths.iter().map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())))).collect()
}

/// A listener's TLS: the configuration new handshakes use, swapped by [`ServerTls::reload`].
pub struct ServerTls {
    /// The listener (`public`, `cluster`), for logs and metrics.
    pub listener: &'static str,
    files: ServerFiles,
    current: RwLock<Arc<ServerConfig>>,
    /// The certificate, shared with this node's outbound client (it presents it for mutual TLS).
    identity: Arc<RwLock<Arc<CertifiedKey>>>,
    /// The CA, shared with this node's outbound client (it verifies peers against it).
    roots: Arc<RwLock<Option<Arc<RootCertStore>>>>,
    /// The files as of the last load attempt.
    seen: Mutex<Stamp>,
}

impl ServerTls {
    /// Reads the files; refuses to start on any problem with them.
    pub fn load(listener: &'static str, files: ServerFiles) -> Result<Arc<ServerTls>, TlsError> {
        let seen = stamp(&files.paths());
        let l = load(&files)?;
        Ok(Arc::new(ServerTls {
            listener,
            files,
            current: RwLock::new(l.server),
            identity: Arc::new(RwLock::new(l.identity)),
            roots: Arc::new(RwLock::new(l.roots)),
            seen: Mutex::new(seen),
        }))
    }

    /// The acceptor for the next handshake.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let cfg = self.current.read().unwrap_or_else(|p| p.into_inner()).clone();
        tokio_rustls::TlsAcceptor::from(cfg)
    }

    /// Re-reads the files; on success new handshakes use them, on failure nothing changes.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = stamp(&self.files.paths());
        let l = load(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = l.server;
        *self.identity.write().unwrap_or_else(|p| p.into_inner()) = l.identity;
        *self.roots.write().unwrap_or_else(|p| p.into_inner()) = l.roots;
        Ok(())
    }

    /// Whether a file changed (or appeared, or vanished) since the last load attempt.
    pub fn changed(&self) -> bool {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) != stamp(&self.files.paths())
    }

    /// The certificate files, for log lines.
    pub fn cert_file(&self) -> &Path {
        &self.files.files.cert
    }

    /// The client configuration of this node's calls to its peers: verifies them against the
    /// cluster CA and presents this listener's certificate when asked (both follow reloads).
    pub fn peer_client(&self) -> Result<Arc<ClientConfig>, TlsError> {
        if self.roots.read().unwrap_or_else(|p| p.into_inner()).is_none() {
            return Err(TlsError::Config("the cluster's client needs a CA file".into()));
        }
        let verifier = Arc::new(Peers { roots: self.roots.clone() });
        let cfg = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(Arc::new(Shared(self.identity.clone())));
        Ok(Arc::new(cfg))
    }
}

/// Reads every configured TLS file as a start would (for `check-config`).
pub fn check(cfg: &crate::config::tls::TlsConfig) -> Result<(), TlsError> {
    if let Some(files) = &cfg.device {
        ServerTls::load("public", ServerFiles::device(files))?;
    }
    if let Some(c) = &cfg.cluster {
        ServerTls::load("cluster", ServerFiles::cluster(c))?.peer_client()?;
    }
    Ok(())
}

/// A client configuration that trusts the CAs in `ca_file` and, given `identity` (certificate
/// and key files), presents that certificate (mutual TLS). For the CLI, the load tool and tests.
pub fn client_config(ca_file: &Path, identity: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = load_roots(ca_file)?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let cfg = match identity {
        Some((cert, key)) => {
            let files = CertFiles { cert: cert.into(), key: key.into() };
            builder.with_client_cert_resolver(Arc::new(Fixed(load_identity(&files)?)))
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

/// One certificate, whatever the client or server asks for.
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl ResolvesClientCert for Fixed {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The node's current cluster certificate, as a client certificate.
#[derive(Debug)]
struct Shared(Arc<RwLock<Arc<CertifiedKey>>>);

impl ResolvesClientCert for Shared {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Verifies peers against the cluster CA as last (re)loaded: webpki's verifier over the current roots.
#[derive(Debug)]
struct Peers {
    roots: Arc<RwLock<Option<Arc<RootCertStore>>>>,
}

impl Peers {
    fn current(&self) -> Result<Arc<WebPkiServerVerifier>, rustls::Error> {
        let roots = self.roots.read().unwrap_or_else(|p| p.into_inner()).clone();
        let roots = roots.ok_or_else(|| rustls::Error::General("no cluster CA".into()))?;
        WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))
    }
}

impl ServerCertVerifier for Peers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current()?.verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}
