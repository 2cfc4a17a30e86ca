//! Test PKI, made at test time with rcgen: a CA, certificates it signs (server and client), and
//! a second CA nobody trusts. Also the TLS side of the harness: which addresses the blocking
//! client ([`super::http::request`]) dials with TLS, and a handshake that reports the server's
//! certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SerialNumber};
use rustls::pki_types::{CertificateDer, ServerName};

/// A CA that writes the certificates it issues as PEM files under `dir`.
pub struct Ca {
    pub dir: PathBuf,
    pub name: String,
    pub cert_file: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// An issued certificate: its files and DER (to recognise it on the wire).
#[derive(Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub der: Vec<u8>,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let cert_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert_file, cert.pem()).unwrap();
        Ca { dir: dir.to_path_buf(), name: name.into(), cert_file, issuer: Issuer::new(params, key) }
    }

    /// A certificate for 127.0.0.1, localhost and `extra_san`, with `serial`, under `file` (`.pem`,
    /// `.key`); `key` reuses a key pair (its PEM) so only the certificate file changes.
    pub fn issue(&self, file: &str, serial: u64, extra_san: &str, key: Option<&str>) -> Issued {
        let mut params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string(), extra_san.to_string()])
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, format!("{file} ({})", self.name));
        params.serial_number = Some(SerialNumber::from(serial));
        let key = match key {
            Some(pem) => KeyPair::from_pem(pem).unwrap(),
            None => KeyPair::generate().unwrap(),
        };
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (self.dir.join(format!("{file}.pem")), self.dir.join(format!("{file}.key")));
        write_atomically(&key_path, key.serialize_pem().as_bytes());
        write_atomically(&cert_path, cert.pem().as_bytes());
        Issued { cert: cert_path, key: key_path, der: cert.der().to_vec() }
    }
}

/// Writes `path` through a temp file and a rename, as an operator's tooling should.
pub fn write_atomically(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A client configuration trusting `ca` (and presenting `identity`).
pub fn client(ca: &Path, identity: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    gateway::tls::client_config(ca, identity.map(|i| (i.cert.as_path(), i.key.as_path()))).unwrap()
}

/// A TLS handshake with `addr`: the server's leaf certificate (DER), or the error.
pub fn peer_certificate(addr: SocketAddr, config: &Arc<rustls::ClientConfig>) -> Result<Vec<u8>, String> {
    let mut tcp = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut conn = rustls::ClientConnection::new(config.clone(), ServerName::from(addr.ip())).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| e.to_string())?;
    }
    let leaf: Option<&CertificateDer> = conn.peer_certificates().and_then(|c| c.first());
    leaf.map(|c| c.to_vec()).ok_or_else(|| "no server certificate".to_string())
}

/// The test's runtime for the project's own async client.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

/// One device handshake with the project's client (`gateway::client::dial`), within 10 s: the
/// open connection and its `hello`, a refusal's status, or the dial error (`stage: error`).
pub fn dial(
    url: &str,
    token: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<(gateway::client::dial::Ws, gateway::client::dial::Hello), String> {
    use gateway::client::dial::{dial, Answer, Target};
    let target = Target::parse(url)?;
    match rt().block_on(dial(&target, 1, token, None, tls, Duration::from_secs(10))) {
        Ok(Answer::Open(ws, hello)) => Ok((*ws, hello)),
        Ok(Answer::Refused { status, body, .. }) => Err(format!("refused: {status} {body}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Whether an open connection still answers: a ping gets its pong within 5 s.
pub fn answers_ping(ws: &mut gateway::client::dial::Ws) -> Result<(), String> {
    use fastwebsockets::{Frame, OpCode, Payload};
    rt().block_on(async {
        ws.write_frame(Frame::new(true, OpCode::Ping, None, Payload::Borrowed(b"still there?")))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(5), ws.read_frame())
                .await
                .map_err(|_| "no pong within 5 s".to_string())?
                .map_err(|e| e.to_string())?;
            match frame.opcode {
                OpCode::Pong => return Ok(()),
                OpCode::Close => return Err("closed".into()),
                _ => continue,
            }
        }
    })
}
