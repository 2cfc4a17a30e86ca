//! A minimal blocking HTTP/1.1 client for tests: one request per connection (`Connection: close`),
//! bounded by a timeout on connect, write and read. Owns no retries: callers decide what a failure means.
//! Addresses registered with [`use_tls`] are dialled with TLS (https).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// Per-request budget. Claims go through Raft and may queue behind a batch on a loaded machine.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, or `Value::Null` with the raw text kept in `{"_raw": ...}` when it is not JSON,
    /// so that assertions print what the server actually said.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| serde_json::json!({ "_raw": self.text() }))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

static TLS: Mutex<Option<HashMap<SocketAddr, Arc<rustls::ClientConfig>>>> = Mutex::new(None);

/// From now on, requests to `addr` speak TLS with `config`.
pub fn use_tls(addr: SocketAddr, config: Arc<rustls::ClientConfig>) {
    TLS.lock().unwrap().get_or_insert_with(HashMap::new).insert(addr, config);
}

fn tls_for(addr: SocketAddr) -> Option<Arc<rustls::ClientConfig>> {
    TLS.lock().unwrap().as_ref().and_then(|m| m.get(&addr).cloned())
}

/// Sends one request and reads the whole response.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response> {
    let stream = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(3)))
        .with_context(|| format!("connect {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    match tls_for(addr) {
        None => exchange(stream, addr, method, path, headers, body),
        Some(config) => {
            let conn = rustls::ClientConnection::new(config, rustls::pki_types::ServerName::from(addr.ip()))?;
            exchange(rustls::StreamOwned::new(conn, stream), addr, method, path, headers, body)
        }
    }
}

fn exchange(
    mut stream: impl Read + Write,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Response> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.unwrap_or(&[]);
    if !body.is_empty() || method == "POST" || method == "PUT" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;

    let mut raw = Vec::new();
    // A server may close after the response without reading everything; a reset after a complete
    // response is not an error for us, so parse whatever arrived before deciding.
    let read_result = stream.read_to_end(&mut raw);
    match parse(&raw) {
        Ok(resp) => Ok(resp),
        Err(e) => match read_result {
            Err(io) => Err(anyhow!(io)).with_context(|| format!("{method} {path} on {addr}: read")),
            Ok(_) => Err(e).with_context(|| format!("{method} {path} on {addr}: parse")),
        },
    }
}

fn parse(raw: &[u8]) -> Result<Response> {
    let end = find(raw, b"\r\n\r\n").ok_or_else(|| anyhow!("no end of headers in {} bytes", raw.len()))?;
    let head = std::str::from_utf8(&raw[..end]).context("non-utf8 head")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        bail!("bad status line {status_line:?}");
    }
    let status: u16 =
        parts.next().and_then(|s| s.parse().ok()).ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect();
    let rest = &raw[end + 4..];
    let get = |name: &str| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let body = if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        dechunk(rest)?
    } else if let Some(len) = get("content-length") {
        let len: usize = len.parse().context("bad content-length")?;
        if rest.len() < len {
            bail!("body truncated: {} of {len} bytes", rest.len());
        }
        rest[..len].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, headers, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = find(rest, b"\r\n").ok_or_else(|| anyhow!("truncated chunk size"))?;
        let size_str = std::str::from_utf8(&rest[..line_end])?;
        let size_str = size_str.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_str, 16).context("bad chunk size")?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size + 2 {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_and_chunked() {
        let r = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((r.status, r.text().as_str()), (200, "{}"));
        let r =
            parse(b"HTTP/1.1 401 Unauthorized\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n1\r\nd\r\n0\r\n\r\n")
                .unwrap();
        assert_eq!((r.status, r.text().as_str()), (401, "abcd"));
    }
}
