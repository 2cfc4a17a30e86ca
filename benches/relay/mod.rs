//! The floor with messages: a bare three-process relay that does what any three-replica gateway
//! of this design must do for a handshake, and nothing else. Each process is the bare server
//! (hyper 1 + fastwebsockets, the same upgrade) plus the least replication that makes a claim and
//! a release durable on a quorum and applied on every replica:
//!
//! - a handshake on a follower is forwarded to the leader over one long-lived TCP connection (no
//!   HTTP, no authentication, forwards queued meanwhile go in the same write); on the leader it
//!   goes straight to the sequencer;
//! - the leader puts what is queued into one entry (at most [`IN_FLIGHT`] entries uncommitted,
//!   as the gateway's log writer keeps two batches in flight), sends it to both followers and
//!   hands it to its own store thread; each replica's store thread writes the entries it has
//!   and `fdatasync`s once for them (a preallocated file, overwritten in place; no record header
//!   or checksum);
//! - an entry is committed once two of the three hold it flushed; the commit index rides on the
//!   next entry or goes alone. Each replica applies committed entries as one non-durable redb
//!   transaction, a row written per command without reading it first (64 bytes for a claim, 32 for
//!   a release: the apply bench's bare row); the leader applies before its next flush, a follower
//!   after it (see [`store`]);
//! - the leader answers once its apply is done: its own handshakes through a oneshot, a
//!   follower's with the forwards' sequence numbers in one message. Only then is the `101` sent.
//!   When the connection ends the session proposes the release the same way and waits for it.
//!
//! No terms, votes, leases, tokens, routes, checks of the log's continuity or metrics: what three
//! processes of this design (forward to a leader, replicate, apply everywhere) cannot do without
//! for a claim and a release, on top of the bare server. The handshakes bench measures it side by
//! side with the bare server and the three gateway nodes.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use fastwebsockets::{upgrade, OpCode, WebSocketError};
use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use redb::{Database, Durability, TableDefinition};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// The environment variable that makes this bench a relay process: `leader`, or the leader's
/// peer address for a follower.
pub const ROLE: &str = "HANDSHAKES_BENCH_RELAY";
/// Where a relay process keeps its log file and its state (a dir the bench made and removes).
const DIR: &str = "HANDSHAKES_BENCH_RELAY_DIR";
/// Entries the leader lets be uncommitted at once, unless `HANDSHAKES_BENCH_RELAY_IN_FLIGHT` says
/// otherwise: two, as the gateway's log writer keeps two batches in flight.
const IN_FLIGHT: u64 = 2;
/// The file in each process's dir where it keeps its counts (see [`Counts`]), rewritten every 100 ms.
const STATS: &str = "stats";
/// The log file's size, overwritten from the start when the writes reach its end.
const LOG_BYTES: u64 = 16 << 20;
/// Devices the handshakes claim in turn (rows overwritten, as the gateway's bench re-claims its devices).
const DEVICES: u64 = 1024;
const ROWS: TableDefinition<&str, &[u8]> = TableDefinition::new("rows");

const CLAIM: u8 = 1;
const RELEASE: u8 = 2;

// Frames between the leader and a follower: a kind, a little-endian u32 length, the payload.
/// Leader → follower once the follower is registered.
const HELLO: u8 = 0;
/// Follower → leader: forwards, each a u64 sequence number and a command.
const FORWARD: u8 = 1;
/// Leader → follower: an entry's index, the commit index, the entry's commands.
const APPEND: u8 = 2;
/// Leader → follower: the commit index alone.
const COMMIT: u8 = 3;
/// Follower → leader: the highest index it holds flushed.
const ACK: u8 = 4;
/// Leader → follower: the sequence numbers of its forwards that are applied.
const DONE: u8 = 5;

/// Three relay processes, killed and their dirs removed on drop.
pub struct Relay {
    pub addrs: Vec<SocketAddr>,
    pub pids: Vec<u32>,
    /// Each process's [`STATS`] file.
    stats: Vec<PathBuf>,
    _children: Vec<super::KillOnDrop>,
    _dir: tempfile::TempDir,
}

/// Starts the leader and two followers; returns once both followers are registered.
pub fn spawn() -> Relay {
    let dir = tempfile::Builder::new().prefix("gateway-bench-relay-").tempdir().expect("relay temp dir");
    let start = |role: &str, name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir(&data).expect("relay data dir");
        let (child, line) = super::respawn(&[(ROLE, role.as_ref()), (DIR, data.as_os_str())]);
        let addrs: Vec<SocketAddr> = line.split_whitespace().map(|a| a.parse().expect("relay address")).collect();
        (super::KillOnDrop(child), addrs, data.join(STATS))
    };
    let leader = start("leader", "l");
    let peer = leader.1[1].to_string();
    let started = [leader, start(&peer, "f1"), start(&peer, "f2")];
    Relay {
        addrs: started.iter().map(|(_, addrs, _)| addrs[0]).collect(),
        pids: started.iter().map(|(child, _, _)| child.0.id()).collect(),
        stats: started.iter().map(|(_, _, stats)| stats.clone()).collect(),
        _children: started.into_iter().map(|(child, _, _)| child).collect(),
        _dir: dir,
    }
}

impl Relay {
    /// The three processes' counts so far, summed: entries and commands (the leader's) and log
    /// flushes (every replica's). Each process rewrites its file every 100 ms.
    pub fn counts(&self) -> [u64; 3] {
        let mut sum = [0; 3];
        for path in &self.stats {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            for (total, n) in sum.iter_mut().zip(text.split_whitespace()) {
                *total += n.parse::<u64>().unwrap_or(0);
            }
        }
        sum
    }
}

/// What a relay process has done so far.
#[derive(Default)]
struct Counts {
    /// Entries the leader formed (0 on a follower).
    entries: AtomicU64,
    /// Commands in them.
    commands: AtomicU64,
    /// Log flushes (`fdatasync`s) on this replica.
    flushes: AtomicU64,
}

/// Runs this process as a relay (the role in [`ROLE`]); never returns.
pub fn serve(role: String) {
    // A panic anywhere (a task, the store thread) ends the process: the bench then sees it gone
    // (no address line, or connections refused) instead of a relay that no longer answers.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
    let dir = PathBuf::from(std::env::var_os(DIR).expect("relay dir"));
    let rt = tokio::runtime::Builder::new_multi_thread().thread_name("relay").enable_all().build().expect("runtime");
    rt.block_on(async move {
        let devices = TcpListener::bind("127.0.0.1:0").await.expect("bind devices");
        let dev_addr = devices.local_addr().expect("addr");
        let counts = Arc::new(Counts::default());
        let (written, stats, tmp) = (counts.clone(), dir.join(STATS), dir.join("stats.tmp"));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            loop {
                tick.tick().await;
                let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
                let line = format!("{} {} {}\n", n(&written.entries), n(&written.commands), n(&written.flushes));
                // Written aside and renamed over, so that a reader never sees a torn file.
                if tokio::fs::write(&tmp, line).await.is_ok() {
                    let _ = tokio::fs::rename(&tmp, &stats).await;
                }
            }
        });
        let proposer = if role == "leader" {
            let peers = TcpListener::bind("127.0.0.1:0").await.expect("bind peers");
            println!("{dev_addr} {}", peers.local_addr().expect("addr"));
            leader(peers, &dir, counts)
        } else {
            let p = follower(&role, &dir, counts).await;
            println!("{dev_addr}");
            p
        };
        let proposer = Arc::new(proposer);
        let next = Arc::new(AtomicU64::new(0));
        loop {
            let Ok((stream, _)) = devices.accept().await else { continue };
            let (proposer, next) = (proposer.clone(), next.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(req, proposer.clone(), next.clone()));
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).with_upgrades().await;
            });
        }
    });
}

async fn handle(
    mut req: Request<Incoming>,
    proposer: Arc<Proposer>,
    next: Arc<AtomicU64>,
) -> Result<Response<Empty<Bytes>>, WebSocketError> {
    let (response, fut) = upgrade::upgrade(&mut req)?;
    let device = format!("relay-{}", next.fetch_add(1, Ordering::Relaxed) % DEVICES);
    proposer.propose(command(CLAIM, &device)).await;
    tokio::spawn(async move {
        if let Ok(mut ws) = fut.await {
            while ws.read_frame().await.is_ok_and(|f| f.opcode != OpCode::Close) {}
        }
        proposer.propose(command(RELEASE, &device)).await;
    });
    Ok(response)
}

/// A command as the log holds it: the op, the device id's length (one byte), the id.
fn command(op: u8, device: &str) -> Vec<u8> {
    let mut c = Vec::with_capacity(2 + device.len());
    c.push(op);
    c.push(device.len() as u8);
    c.extend_from_slice(device.as_bytes());
    c
}

/// Splits an entry's commands: (op, device id).
fn commands(mut entry: &[u8]) -> impl Iterator<Item = (u8, &str)> {
    std::iter::from_fn(move || {
        let (&op, rest) = entry.split_first()?;
        let (&len, rest) = rest.split_first()?;
        let (id, rest) = rest.split_at(len as usize);
        entry = rest;
        Some((op, std::str::from_utf8(id).expect("relay device id")))
    })
}

/// Appends a frame of `kind` to `out`, its payload written by `payload`.
fn frame(out: &mut Vec<u8>, kind: u8, payload: impl FnOnce(&mut Vec<u8>)) {
    out.push(kind);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    payload(out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

async fn read_frame(r: &mut BufReader<OwnedReadHalf>, buf: &mut Vec<u8>) -> std::io::Result<u8> {
    let kind = r.read_u8().await?;
    let len = r.read_u32_le().await? as usize;
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(kind)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Writes whatever is queued for one peer connection in one write.
async fn writer(mut w: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut buf = Vec::new();
    while let Some(first) = rx.recv().await {
        buf.clear();
        buf.extend_from_slice(&first);
        while let Ok(more) = rx.try_recv() {
            buf.extend_from_slice(&more);
        }
        if w.write_all(&buf).await.is_err() {
            return;
        }
    }
}

/// How a handshake's command reaches the leader's sequencer.
enum Proposer {
    Leader(mpsc::UnboundedSender<Event>),
    Follower { out: mpsc::UnboundedSender<Out>, waiting: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>, seq: AtomicU64 },
}

impl Proposer {
    /// Proposes `cmd` and waits until the leader has applied it.
    async fn propose(&self, cmd: Vec<u8>) {
        let (tx, rx) = oneshot::channel();
        match self {
            Proposer::Leader(events) => {
                let _ = events.send(Event::Propose(cmd, Waiter::Local(tx)));
            }
            Proposer::Follower { out, waiting, seq } => {
                let seq = seq.fetch_add(1, Ordering::Relaxed);
                waiting.lock().expect("waiting").insert(seq, tx);
                let _ = out.send(Out::Forward(seq, cmd));
            }
        }
        let _ = rx.await;
    }
}

/// What a store thread is asked to do.
enum Store {
    /// Write an entry (index, commands) to the log; flushed with whatever else is queued.
    Append(u64, Vec<u8>),
    /// Apply the held entries up to this index.
    Apply(u64),
}

/// A replica's log and state: writes the queued entries and `fdatasync`s once for them, then
/// reports the highest flushed index; applies committed entries in one non-durable redb
/// transaction, then reports the highest applied index. With both to do, the leader applies first
/// (its answers wait on the apply, its next commit on the flush), a follower flushes first (the
/// leader's commit waits on its flush, nothing on its apply).
fn store(
    dir: &Path,
    apply_first: bool,
    counts: Arc<Counts>,
    flushed: impl Fn(u64) + Send + 'static,
    applied: impl Fn(u64) + Send + 'static,
) -> std::sync::mpsc::Sender<Store> {
    let log = File::create(dir.join("log")).expect("relay log");
    (&log).write_all(&vec![0u8; LOG_BYTES as usize]).expect("zero-fill relay log");
    log.sync_all().expect("sync relay log");
    let db = Database::builder().set_cache_size(64 << 20).create(dir.join("state.redb")).expect("relay state");
    let (tx, rx) = std::sync::mpsc::channel::<Store>();
    std::thread::Builder::new()
        .name("relay-log".into())
        .spawn(move || {
            let (mut at, mut held) = (0u64, VecDeque::<(u64, Vec<u8>)>::new());
            while let Ok(first) = rx.recv() {
                let (mut wrote, mut apply) = (None, None);
                for job in std::iter::once(first).chain(rx.try_iter()) {
                    match job {
                        Store::Append(index, entry) => {
                            if at + entry.len() as u64 > LOG_BYTES {
                                at = 0;
                            }
                            log.write_all_at(&entry, at).expect("relay log write");
                            at += entry.len() as u64;
                            held.push_back((index, entry));
                            wrote = Some(index);
                        }
                        Store::Apply(upto) => apply = apply.max(Some(upto)),
                    }
                }
                let flush = || {
                    if let Some(index) = wrote {
                        log.sync_data().expect("relay log fdatasync");
                        counts.flushes.fetch_add(1, Ordering::Relaxed);
                        flushed(index);
                    }
                };
                if !apply_first {
                    flush();
                }
                if let Some(upto) = apply {
                    if apply_upto(&db, &mut held, upto) {
                        applied(upto);
                    }
                }
                if apply_first {
                    flush();
                }
            }
        })
        .expect("relay log thread");
    tx
}

/// Applies the held entries up to `upto` in one non-durable transaction, a row a command (64
/// bytes for a claim, 32 for a release); false when none was held.
fn apply_upto(db: &Database, held: &mut VecDeque<(u64, Vec<u8>)>, upto: u64) -> bool {
    if held.front().is_none_or(|(i, _)| *i > upto) {
        return false;
    }
    let value = [7u8; 64];
    let mut txn = db.begin_write().expect("begin");
    txn.set_durability(Durability::None).expect("durability");
    {
        let mut rows = txn.open_table(ROWS).expect("table");
        while held.front().is_some_and(|(i, _)| *i <= upto) {
            let (_, entry) = held.pop_front().expect("front");
            for (op, device) in commands(&entry) {
                let v = if op == CLAIM { &value[..] } else { &value[..32] };
                rows.insert(device, v).expect("insert");
            }
        }
    }
    txn.commit().expect("commit");
    true
}

/// Who waits for a command the leader applies.
enum Waiter {
    Local(oneshot::Sender<()>),
    /// A follower's forward: the follower and the forward's sequence number.
    Remote(usize, u64),
}

enum Event {
    Propose(Vec<u8>, Waiter),
    Joined(mpsc::UnboundedSender<Vec<u8>>),
    Ack(usize, u64),
    Flushed(u64),
    Applied(u64),
}

/// Starts the leader's sequencer and its peer listener; the proposer its devices use.
fn leader(peers: TcpListener, dir: &Path, counts: Arc<Counts>) -> Proposer {
    let (events, mut rx) = mpsc::unbounded_channel::<Event>();
    let (e1, e2) = (events.clone(), events.clone());
    let flushed = move |i| drop(e1.send(Event::Flushed(i)));
    let store = store(dir, true, counts.clone(), flushed, move |i| drop(e2.send(Event::Applied(i))));
    let joins = events.clone();
    tokio::spawn(async move {
        for id in 0..2 {
            let (s, _) = peers.accept().await.expect("accept follower");
            s.set_nodelay(true).expect("nodelay");
            let (r, w) = s.into_split();
            let (tx, wrx) = mpsc::unbounded_channel();
            let mut hello = Vec::new();
            frame(&mut hello, HELLO, |_| {});
            let _ = tx.send(hello);
            let _ = joins.send(Event::Joined(tx));
            tokio::spawn(writer(w, wrx));
            let events = joins.clone();
            tokio::spawn(async move {
                let (mut r, mut buf) = (BufReader::new(r), Vec::new());
                while let Ok(kind) = read_frame(&mut r, &mut buf).await {
                    if kind == ACK {
                        let _ = events.send(Event::Ack(id, u64_at(&buf, 0)));
                        continue;
                    }
                    let mut at = 0;
                    while at < buf.len() {
                        let seq = u64_at(&buf, at);
                        let len = 2 + buf[at + 9] as usize;
                        let cmd = buf[at + 8..at + 8 + len].to_vec();
                        at += 8 + len;
                        let _ = events.send(Event::Propose(cmd, Waiter::Remote(id, seq)));
                    }
                }
            });
        }
    });
    let in_flight = std::env::var("HANDSHAKES_BENCH_RELAY_IN_FLIGHT").ok().and_then(|v| v.parse().ok());
    tokio::spawn(async move {
        let mut s = Sequencer { in_flight: in_flight.unwrap_or(IN_FLIGHT).max(1), counts, ..Sequencer::default() };
        while let Some(first) = rx.recv().await {
            s.on(first);
            while let Ok(more) = rx.try_recv() {
                s.on(more);
            }
            s.step(&store);
        }
    });
    Proposer::Leader(events)
}

#[derive(Default)]
struct Sequencer {
    in_flight: u64,
    counts: Arc<Counts>,
    followers: Vec<mpsc::UnboundedSender<Vec<u8>>>,
    pending: Vec<(Vec<u8>, Waiter)>,
    last: u64,
    flushed: u64,
    acked: Vec<u64>,
    commit: u64,
    applied: u64,
    waiting: VecDeque<(u64, Vec<Waiter>)>,
}

impl Sequencer {
    fn on(&mut self, e: Event) {
        match e {
            Event::Propose(cmd, w) => self.pending.push((cmd, w)),
            Event::Joined(tx) => {
                self.followers.push(tx);
                self.acked.push(0);
            }
            Event::Ack(f, i) => self.acked[f] = self.acked[f].max(i),
            Event::Flushed(i) => self.flushed = i,
            Event::Applied(i) => self.applied = i,
        }
    }

    /// Commits what a quorum holds, answers what is applied, and starts an entry of what is queued.
    fn step(&mut self, store: &std::sync::mpsc::Sender<Store>) {
        let mut held: Vec<u64> = std::iter::once(self.flushed).chain(self.acked.iter().copied()).collect();
        held.sort_unstable_by(|a, b| b.cmp(a));
        let quorum = held.get(1).copied().unwrap_or(0);
        if quorum > self.commit {
            self.commit = quorum;
            let _ = store.send(Store::Apply(quorum));
            if self.pending.is_empty() {
                let mut f = Vec::new();
                frame(&mut f, COMMIT, |b| b.extend_from_slice(&quorum.to_le_bytes()));
                self.followers.iter().for_each(|tx| drop(tx.send(f.clone())));
            }
        }
        let mut done: Vec<Vec<u64>> = vec![Vec::new(); self.followers.len()];
        while self.waiting.front().is_some_and(|(i, _)| *i <= self.applied) {
            for w in self.waiting.pop_front().expect("front").1 {
                match w {
                    Waiter::Local(tx) => drop(tx.send(())),
                    Waiter::Remote(f, seq) => done[f].push(seq),
                }
            }
        }
        for (tx, seqs) in self.followers.iter().zip(done).filter(|(_, s)| !s.is_empty()) {
            let mut f = Vec::new();
            frame(&mut f, DONE, |b| seqs.iter().for_each(|s| b.extend_from_slice(&s.to_le_bytes())));
            let _ = tx.send(f);
        }
        if self.pending.is_empty() || self.last - self.commit >= self.in_flight {
            return;
        }
        self.last += 1;
        self.counts.entries.fetch_add(1, Ordering::Relaxed);
        self.counts.commands.fetch_add(self.pending.len() as u64, Ordering::Relaxed);
        let (mut entry, mut waiters) = (Vec::new(), Vec::with_capacity(self.pending.len()));
        for (cmd, w) in self.pending.drain(..) {
            entry.extend_from_slice(&cmd);
            waiters.push(w);
        }
        let mut f = Vec::new();
        frame(&mut f, APPEND, |b| {
            b.extend_from_slice(&self.last.to_le_bytes());
            b.extend_from_slice(&self.commit.to_le_bytes());
            b.extend_from_slice(&entry);
        });
        self.followers.iter().for_each(|tx| drop(tx.send(f.clone())));
        let _ = store.send(Store::Append(self.last, entry));
        self.waiting.push_back((self.last, waiters));
    }
}

/// What a follower sends the leader.
enum Out {
    Forward(u64, Vec<u8>),
    Ack(u64),
}

/// Connects to the leader and waits until it is registered; the proposer its devices use.
async fn follower(leader: &str, dir: &Path, counts: Arc<Counts>) -> Proposer {
    let s = TcpStream::connect(leader).await.expect("connect to the relay leader");
    s.set_nodelay(true).expect("nodelay");
    let (r, mut w) = s.into_split();
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    assert_eq!(read_frame(&mut r, &mut buf).await.expect("hello"), HELLO);
    let (out, mut orx) = mpsc::unbounded_channel::<Out>();
    let acks = out.clone();
    let store = store(dir, false, counts, move |i| drop(acks.send(Out::Ack(i))), |_| {});
    let waiting = Arc::new(Mutex::new(HashMap::<u64, oneshot::Sender<()>>::new()));
    tokio::spawn(async move {
        let mut bytes = Vec::new();
        while let Some(first) = orx.recv().await {
            let (mut fwd, mut ack) = (Vec::new(), None);
            for o in std::iter::once(first).chain(std::iter::from_fn(|| orx.try_recv().ok())) {
                match o {
                    Out::Forward(seq, cmd) => {
                        fwd.extend_from_slice(&seq.to_le_bytes());
                        fwd.extend_from_slice(&cmd);
                    }
                    Out::Ack(i) => ack = ack.max(Some(i)),
                }
            }
            bytes.clear();
            if !fwd.is_empty() {
                frame(&mut bytes, FORWARD, |b| b.extend_from_slice(&fwd));
            }
            if let Some(i) = ack {
                frame(&mut bytes, ACK, |b| b.extend_from_slice(&i.to_le_bytes()));
            }
            if w.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let answers = waiting.clone();
    tokio::spawn(async move {
        let mut commit = 0;
        while let Ok(kind) = read_frame(&mut r, &mut buf).await {
            match kind {
                APPEND | COMMIT => {
                    let at = if kind == APPEND {
                        let _ = store.send(Store::Append(u64_at(&buf, 0), buf[16..].to_vec()));
                        8
                    } else {
                        0
                    };
                    if u64_at(&buf, at) > commit {
                        commit = u64_at(&buf, at);
                        let _ = store.send(Store::Apply(commit));
                    }
                }
                DONE => {
                    let mut waiting = answers.lock().expect("waiting");
                    for at in (0..buf.len()).step_by(8) {
                        if let Some(tx) = waiting.remove(&u64_at(&buf, at)) {
                            let _ = tx.send(());
                        }
                    }
                }
                _ => {}
            }
        }
    });
    Proposer::Follower { out, waiting, seq: AtomicU64::new(0) }
}
