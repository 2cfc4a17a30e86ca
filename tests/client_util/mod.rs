//! Runs `gateway::client::device::Device`s in the background for the `client_*` tests and
//! collects their events with the moment each was reported, so tests can assert order and timing.
#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gateway::client::device::{AttemptStore, Device, DeviceConfig, Event, StopReason};
use gateway::protocol::ServerFrame;
use tokio_util::sync::CancellationToken;

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("client runtime")
    })
}

/// Test-friendly knobs: base 500 ms, cap 4 s, stable after 2 s, 10 s handshake bound.
pub fn config(url: &str, device: &str, token: &str, epoch: u64, seed: u64) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(url, device, token, epoch);
    cfg.base = Duration::from_millis(500);
    cfg.cap = Duration::from_secs(4);
    cfg.stable_after = Duration::from_secs(2);
    cfg.seed = seed;
    cfg
}

/// One running device and everything it reported so far.
pub struct Running {
    pub name: String,
    rx: mpsc::Receiver<(Instant, Event)>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<StopReason>>,
    pub log: Vec<(Instant, Event)>,
}

pub fn start(name: &str, cfg: DeviceConfig, store: Box<dyn AttemptStore>) -> Running {
    let (tx, rx) = mpsc::channel();
    let stop = CancellationToken::new();
    let device = Device::new(cfg, store);
    let task = rt().spawn(device.run(
        move |e| {
            let _ = tx.send((Instant::now(), e));
        },
        stop.clone(),
    ));
    Running { name: name.to_string(), rx, stop, task: Some(task), log: Vec::new() }
}

impl Running {
    /// Receives events until one matches `pred` (returned with its time); panics at `bound`
    /// with everything seen so far.
    pub fn wait_for(&mut self, bound: Duration, what: &str, pred: impl Fn(&Event) -> bool) -> (Instant, Event) {
        let deadline = Instant::now() + bound;
        loop {
            match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((at, e)) => {
                    self.log.push((at, e.clone()));
                    if pred(&e) {
                        return (at, e);
                    }
                }
                Err(_) => panic!("{}: no {what} within {bound:?}; events: {:#?}", self.name, self.log),
            }
        }
    }

    /// Moves every event reported so far into `log` without waiting.
    pub fn poll(&mut self) {
        self.log.extend(self.rx.try_iter());
    }

    /// Events logged so far that match `pred`.
    pub fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.log.iter().filter(|(_, e)| pred(e)).count()
    }

    /// Waits for `run` to return on its own.
    pub fn join(mut self, bound: Duration) -> (StopReason, Vec<(Instant, Event)>) {
        let task = self.task.take().expect("joined once");
        let reason = rt()
            .block_on(async { tokio::time::timeout(bound, task).await })
            .unwrap_or_else(|_| panic!("{}: run did not return within {bound:?}; events: {:#?}", self.name, self.log))
            .expect("device task panicked");
        self.log.extend(self.rx.try_iter());
        (reason, std::mem::take(&mut self.log))
    }

    /// Cancels and waits for `run` to return.
    pub fn shutdown(self, bound: Duration) -> (StopReason, Vec<(Instant, Event)>) {
        self.stop.cancel();
        self.join(bound)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// Messages as a device received them: (seq, payload).
pub type Messages = Vec<(u64, serde_json::Value)>;

/// The messages a device received, in arrival order.
pub fn received(r: &mut Running) -> Messages {
    r.poll();
    r.log
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Frame(ServerFrame::Msg { seq, payload }) => Some((*seq, payload.clone())),
            _ => None,
        })
        .collect()
}

/// For `wait_until`: `Ok` with the device's messages once it holds at least `n`, else `Err` with
/// what it holds.
pub fn holds(r: &mut Running, n: usize) -> Result<Messages, Messages> {
    let got = received(r);
    if got.len() >= n {
        Ok(got)
    } else {
        Err(got)
    }
}

/// Starts `n` devices `{prefix}-{k}` pinned to node `at` (`?steer=off`) with the nodes `others`
/// as further URLs (where they move when `at` goes away); device k's backoff seed is `seed0 + k`.
pub fn pinned(
    c: &super::common::Cluster,
    at: usize,
    others: &[usize],
    prefix: &str,
    n: usize,
    seed0: u64,
) -> Vec<Running> {
    (0..n)
        .map(|k| {
            let d = format!("{prefix}-{k}");
            let mut cfg =
                config(&format!("{}/ws?steer=off", c.public_url(at)), &d, &c.token(&d, 0), 0, seed0 + k as u64);
            cfg.urls.extend(others.iter().map(|&s| c.public_url(s)));
            start(&d, cfg, Box::new(gateway::client::device::MemoryStore(0)))
        })
        .collect()
}
