//! Loopback ports for the nodes and servers a test or a bench starts, never the same one twice
//! in a process. Shared by the tests' harness and the benches' (`benches/support`, by path).

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago and that this process has not handed out before.
pub fn free_port() -> u16 {
    listen_local().local_addr().unwrap().port()
}

/// A loopback listener on an ephemeral port this process has not handed out before, for the
/// test's own servers (fault proxies, backends). A port [`free_port`] handed out is free until
/// its node binds it, and the kernel may give it to another `bind(0)` meanwhile: a proxy that
/// took a node's cluster port answered that node's health check for it, and the node could
/// not listen (`Address already in use`).
pub fn listen_local() -> TcpListener {
    let mut taken = Vec::new(); // held until a new port comes, so the kernel offers another
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if HANDED_OUT.lock().unwrap().get_or_insert_with(HashSet::new).insert(port) {
            return listener;
        }
        taken.push(listener);
    }
}
