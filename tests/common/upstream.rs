//! A backend for device `up` tests: a hyper server on 127.0.0.1:0 inside the test process, on its
//! own runtime. It answers as its [`Behave`] says (200, a status such as 503, a delay, or never),
//! counts every request and records each one's `Idempotency-Key` and body. Dropping it stops it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// How the backend answers the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behave {
    Ok,
    /// Answer this status at once (503, 400, ...).
    Status(u16),
    /// Answer 200 after this long.
    Slow(Duration),
    /// Never answer (the connection is held until the client gives up).
    Hang,
}

/// One request as the backend saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub key: Option<String>,
    pub body: Value,
    /// What it answered (0: nothing, it hung).
    pub status: u16,
}

#[derive(Default)]
struct State {
    behave: Option<Behave>,
    seen: Vec<Seen>,
}

pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Upstream {
    pub fn start(behave: Behave) -> Upstream {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let state = Arc::new(Mutex::new(State { behave: Some(behave), seen: Vec::new() }));
        let listener = super::listen_local();
        listener.set_nonblocking(true).unwrap();
        let listener = {
            let _entered = rt.enter();
            tokio::net::TcpListener::from_std(listener).unwrap()
        };
        let addr = listener.local_addr().unwrap();
        let shared = state.clone();
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { continue };
                let state = shared.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), svc).await;
                });
            }
        });
        Upstream { addr, state, rt: Some(rt) }
    }

    /// `http://127.0.0.1:port/ingest`
    pub fn url(&self) -> String {
        format!("http://{}/ingest", self.addr)
    }

    pub fn set(&self, behave: Behave) {
        self.state.lock().unwrap().behave = Some(behave);
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().seen.len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn answer(state: Arc<Mutex<State>>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let at = Instant::now();
    let key = req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body = req.into_body().collect().await?.to_bytes();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let behave = state.lock().unwrap().behave.unwrap_or(Behave::Ok);
    let status = match behave {
        Behave::Ok => 200,
        Behave::Status(s) => s,
        Behave::Slow(_) => 200,
        Behave::Hang => 0,
    };
    state.lock().unwrap().seen.push(Seen { at, key, body, status });
    match behave {
        Behave::Slow(d) => tokio::time::sleep(d).await,
        Behave::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
        _ => {}
    }
    let status = StatusCode::from_u16(status.max(200)).unwrap();
    Ok(Response::builder().status(status).body(Full::new(Bytes::from_static(b"{}"))).unwrap())
}
