//! A WebSocket client built by hand on a blocking socket, for hostile devices: it upgrades, then
//! writes whatever frames a test wants (unmasked payload via a zero mask, invalid UTF-8, floods)
//! and reads only when told to — never in the background.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub struct Raw {
    pub stream: TcpStream,
}

impl Raw {
    /// Upgrades `/ws?attempt=N&steer=off` with `token`; panics unless the answer is 101.
    pub fn open(addr: SocketAddr, token: &str, attempt: u64) -> Raw {
        let stream = connect(addr, None, None);
        let (status, head) = upgrade(&stream, addr, token, attempt);
        assert_eq!(status, 101, "{head}");
        stream.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
        Raw { stream }
    }

    /// Writes one masked frame; false once the node stopped taking bytes (or closed).
    pub fn frame(&mut self, fin: bool, opcode: u8, payload: &[u8]) -> bool {
        let mut frame = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n <= 0xffff => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&[0, 0, 0, 0]); // a zero mask: the payload goes as is
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame).is_ok()
    }

    /// One complete text frame.
    pub fn text(&mut self, payload: &[u8]) -> bool {
        self.frame(true, 0x1, payload)
    }

    /// Reads server frames until a close; its code, or None if the connection ended without one
    /// within `bound`.
    pub fn read_close(&mut self, bound: Duration) -> Option<u16> {
        loop {
            let (opcode, payload) = self.next_frame(bound)?;
            if opcode == 0x8 {
                return Some(if payload.len() >= 2 { u16::from_be_bytes([payload[0], payload[1]]) } else { 1005 });
            }
        }
    }

    /// The next server frame (unmasked) as (opcode, payload), or None if none came within `bound`.
    pub fn next_frame(&mut self, bound: Duration) -> Option<(u8, Vec<u8>)> {
        self.stream.set_read_timeout(Some(bound)).unwrap();
        let mut h = [0u8; 2];
        self.stream.read_exact(&mut h).ok()?;
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                self.stream.read_exact(&mut b).ok()?;
                u64::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                self.stream.read_exact(&mut b).ok()?;
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        let mut payload = vec![0u8; len as usize];
        self.stream.read_exact(&mut payload).ok()?;
        Some((h[0] & 0x0f, payload))
    }
}

/// A blocking connection to `addr`, from the local address `source` when given (another loopback
/// address, e.g. 127.0.0.2) and with a receive buffer of `recv_buffer` bytes when given.
pub fn connect(addr: SocketAddr, source: Option<&str>, recv_buffer: Option<u32>) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stream = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(size) = recv_buffer {
            s.set_recv_buffer_size(size).unwrap();
        }
        if let Some(source) = source {
            s.bind(format!("{source}:0").parse().unwrap()).unwrap();
        }
        s.connect(addr).await.unwrap().into_std().unwrap()
    });
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// Sends `GET /ws?attempt=N&steer=off` with the upgrade headers and `token`, and reads the answer's
/// head byte by byte, never past it (what follows a 101 is left unread): its status and the head.
pub fn upgrade(stream: &TcpStream, addr: SocketAddr, token: &str, attempt: u64) -> (u16, String) {
    let req = format!(
        "GET /ws?attempt={attempt}&steer=off HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    let mut stream = stream;
    stream.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head)
}

/// The resident memory of process `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

/// This process's soft limit of open files.
pub fn open_file_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}
