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
    /// Upgrades `/ws?attempt=N&steer=off` with `token`; panics unless the answer is 101. Reads the
    /// 101 head byte by byte, never past it.
    pub fn open(addr: SocketAddr, token: &str, attempt: u64) -> Raw {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "GET /ws?attempt={attempt}&steer=off HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
        );
        stream.write_all(req.as_bytes()).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed during the upgrade: {head:?}");
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
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
        self.stream.set_read_timeout(Some(bound)).unwrap();
        loop {
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
            if h[0] & 0x0f == 0x8 {
                return Some(if payload.len() >= 2 { u16::from_be_bytes([payload[0], payload[1]]) } else { 1005 });
            }
        }
    }
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
