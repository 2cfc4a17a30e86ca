//! A TCP fault proxy in the test process, on 127.0.0.1: it forwards to a target port and delays
//! every byte going to the target by a settable latency (replies pass at once), without limiting
//! throughput. A node advertises the proxy's address (`--cluster-advertise`), so every Raft RPC
//! and forwarded write sent to it is late by that much: `tc netem` does not work here.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

pub struct DelayProxy {
    addr: SocketAddr,
    target: Arc<AtomicU16>,
    delay_ms: Arc<AtomicU64>,
}

impl DelayProxy {
    /// Listens on an ephemeral port; connections wait (up to 5 s) for a target to be set.
    pub fn start() -> DelayProxy {
        let listener = super::listen_local();
        let addr = listener.local_addr().unwrap();
        let (target, delay_ms) = (Arc::new(AtomicU16::new(0)), Arc::new(AtomicU64::new(0)));
        let (t, d) = (target.clone(), delay_ms.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (t, d) = (t.clone(), d.clone());
                std::thread::spawn(move || pipe(client, &t, d));
            }
        });
        DelayProxy { addr, target, delay_ms }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set_target(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    /// Bytes read from now on reach the target `delay` later.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u64, Ordering::SeqCst);
    }
}

fn pipe(client: TcpStream, target: &AtomicU16, delay_ms: Arc<AtomicU64>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let port = loop {
        match target.load(Ordering::SeqCst) {
            0 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            0 => return,
            p => break p,
        }
    };
    let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else { return };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    // Replies: straight back.
    let (mut from_server, mut to_client) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_server, &mut to_client);
        let _ = to_client.shutdown(Shutdown::Write);
    });
    // Requests: stamped when read, written once their delay has passed.
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let mut to_server = server;
    std::thread::spawn(move || {
        for (due, bytes) in rx {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to_server.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let mut from_client = client;
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from_client.read(&mut buf) {
        if n == 0 {
            break;
        }
        let due = Instant::now() + Duration::from_millis(delay_ms.load(Ordering::SeqCst));
        if tx.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
}
