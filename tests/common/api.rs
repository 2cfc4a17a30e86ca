//! The cluster listener as tests use it: authenticated status/claim/route calls, and waiting for
//! the nodes to agree. `Api` is the `Send + Clone` part for background writer threads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::status::{self, View};
use super::{http, wait_until, Cluster, Start, TIMING};

/// One publish attempt against a cluster listener (`POST /v1/devices/{device}/messages`):
/// (status, body), or the transport error. Usable from threads that do not hold the `Cluster`.
pub fn publish_at(
    addr: SocketAddr,
    bearer: &str,
    device: &str,
    body: &Value,
    key: Option<&str>,
    timeout: Duration,
) -> Result<(u16, Value), String> {
    let mut headers = vec![("Authorization", bearer), ("Content-Type", "application/json")];
    if let Some(k) = key {
        headers.push(("Idempotency-Key", k));
    }
    let path = format!("/v1/devices/{device}/messages");
    let bytes = body.to_string().into_bytes();
    http::request(addr, "POST", &path, &headers, Some(&bytes), timeout)
        .map(|r| (r.status, r.json()))
        .map_err(|e| format!("{e:#}"))
}

impl Cluster {
    // ---- cluster listener API ---------------------------------------------------------------

    /// One publish through node `i`; panics on a transport error.
    pub fn publish(&self, i: usize, device: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
        let addr = self.nodes[i].cluster_addr();
        publish_at(addr, &self.bearer(), device, body, key, http::REQUEST_TIMEOUT)
            .unwrap_or_else(|e| panic!("publish to {device} via node {i}: {e}"))
    }

    /// Publishes until accepted, rotating over `via` and retrying 503s and transport errors with
    /// the same key; returns the reply's seq.
    pub fn publish_ok(&self, via: &[usize], device: &str, body: &Value, key: &str) -> u64 {
        let bearer = self.bearer();
        let mut k = 0;
        wait_until(TIMING.settle_bound(), &format!("publish {key} to {device}"), || {
            k += 1;
            let addr = self.nodes[via[k % via.len()]].cluster_addr();
            match publish_at(addr, &bearer, device, body, Some(key), http::REQUEST_TIMEOUT) {
                Ok((200, v)) => Ok(v["seq"].as_u64().unwrap()),
                other => Err(other),
            }
        })
    }

    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.secret)
    }

    pub fn get(&self, i: usize, path: &str) -> anyhow::Result<http::Response> {
        let auth = self.bearer();
        http::request(
            self.nodes[i].cluster_addr(),
            "GET",
            path,
            &[("Authorization", &auth)],
            None,
            http::REQUEST_TIMEOUT,
        )
    }

    /// One counter or gauge from node `i`'s `/metrics` (sum over label sets), or None if absent.
    pub fn metric(&self, i: usize, name: &str) -> Option<f64> {
        let r = self.get(i, "/metrics").ok()?;
        let text = r.text();
        let mut found = None;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (key, value) = line.rsplit_once(' ')?;
            let metric = key.split('{').next()?;
            if metric == name {
                *found.get_or_insert(0.0) += value.parse::<f64>().ok()?;
            }
        }
        found
    }

    pub fn post_json(&self, i: usize, path: &str, body: &Value) -> anyhow::Result<http::Response> {
        let auth = self.bearer();
        let body = serde_json::to_vec(body).unwrap();
        http::request(
            self.nodes[i].cluster_addr(),
            "POST",
            path,
            &[("Authorization", &auth), ("Content-Type", "application/json")],
            Some(&body),
            http::REQUEST_TIMEOUT,
        )
    }

    /// `GET /cluster/status` on node `i`, authenticated.
    pub fn try_status(&self, i: usize) -> Result<Value, String> {
        match self.get(i, "/cluster/status") {
            Ok(r) if r.status == 200 => Ok(r.json()),
            Ok(r) => Err(format!("{}: status {}: {}", self.nodes[i].name, r.status, r.text())),
            Err(e) => Err(format!("{}: {e:#}", self.nodes[i].name)),
        }
    }

    pub fn status_json(&self, i: usize) -> Value {
        self.try_status(i).unwrap_or_else(|e| panic!("status: {e}"))
    }

    pub fn view(&self, i: usize) -> Result<View, String> {
        let s = self.try_status(i)?;
        View::from_json(&s).ok_or_else(|| format!("{}: unexpected status shape: {s}", self.nodes[i].name))
    }

    /// This node's own id, as it reports it.
    pub fn node_id(&self, i: usize) -> u64 {
        let name = &self.nodes[i].name;
        wait_until(Duration::from_secs(10), &format!("{name} to report its id"), || {
            let s = self.try_status(i)?;
            status::node_id(&s).ok_or_else(|| format!("no node.id in {s}"))
        })
    }

    /// `POST /v1/devices/{device}/claim` on node `i`: (HTTP status, JSON body). Transport errors
    /// come back as `Err` so callers under failure injection can count them as "unknown".
    pub fn try_claim(
        &self,
        i: usize,
        device: &str,
        conn: u64,
        epoch: u64,
        attempt: u64,
    ) -> anyhow::Result<(u16, Value)> {
        let r = self.post_json(
            i,
            &format!("/v1/devices/{device}/claim"),
            &json!({ "conn": conn, "epoch": epoch, "attempt": attempt }),
        )?;
        Ok((r.status, r.json()))
    }

    pub fn claim(&self, i: usize, device: &str, conn: u64, epoch: u64, attempt: u64) -> (u16, Value) {
        self.try_claim(i, device, conn, epoch, attempt)
            .unwrap_or_else(|e| panic!("claim {device} on {}: {e:#}", self.nodes[i].name))
    }

    /// Claims until accepted (a fresh leader may answer 503 for a moment); returns the reply body.
    pub fn claim_accepted(
        &self,
        i: usize,
        device: &str,
        conn: u64,
        epoch: u64,
        attempt: u64,
        bound: Duration,
    ) -> Value {
        let name = self.nodes[i].name.clone();
        // A try that timed out or got 503 may still commit; retrying the same (epoch, attempt) then
        // answers 409 (a claim must be strictly newer). Recognise our own claim by its route.
        let mut ambiguous = false;
        wait_until(bound, &format!("claim {device} (conn {conn}, {epoch}/{attempt}) accepted on {name}"), || match self
            .try_claim(i, device, conn, epoch, attempt)
        {
            Ok((200, v)) if v["result"] == "accepted" => Ok(v),
            Ok((409, v)) => {
                let mine = (v["floor_epoch"].as_u64(), v["floor_attempt"].as_u64()) == (Some(epoch), Some(attempt));
                if ambiguous && mine {
                    if let Ok((200, r)) = self.try_route(i, device) {
                        if r["conn"].as_u64() == Some(conn) {
                            return Ok(json!({"result": "accepted", "version": r["version"], "node": r["node"],
                                                 "superseded": null, "recovered_from_route": true}));
                        }
                    }
                }
                panic!("claim {device} on {name} unexpectedly stale: {v}")
            }
            Ok((code, v)) => {
                ambiguous = true;
                Err(format!("{code} {v}"))
            }
            Err(e) => {
                ambiguous = true;
                Err(format!("{e:#}"))
            }
        })
    }

    /// `GET /v1/devices/{device}/route` on node `i`.
    pub fn route(&self, i: usize, device: &str) -> (u16, Value) {
        let r = self
            .get(i, &format!("/v1/devices/{device}/route"))
            .unwrap_or_else(|e| panic!("route {device} on {}: {e:#}", self.nodes[i].name));
        (r.status, r.json())
    }

    pub fn try_route(&self, i: usize, device: &str) -> Result<(u16, Value), String> {
        let r = self.get(i, &format!("/v1/devices/{device}/route")).map_err(|e| format!("{e:#}"))?;
        Ok((r.status, r.json()))
    }

    // ---- agreement -------------------------------------------------------------------------

    /// Waits until every node in `on` reports the same `View` (with a leader) and `accept` holds for
    /// it; returns that view.
    pub fn wait_agreement(&self, on: &[usize], bound: Duration, what: &str, accept: impl Fn(&View) -> bool) -> View {
        wait_until(bound, what, || {
            let views: Vec<(String, Result<View, String>)> =
                on.iter().map(|&i| (self.nodes[i].name.clone(), self.view(i))).collect();
            let first = match &views[0].1 {
                Ok(v) => v.clone(),
                Err(_) => return Err(views),
            };
            let agree = views.iter().all(|(_, v)| v.as_ref().ok() == Some(&first));
            if agree && first.leader.is_some() && accept(&first) {
                Ok(first)
            } else {
                Err(views)
            }
        })
    }

    /// Bootstraps n1 and joins n2..=n`count` (started with `--standby`) through n1; waits until all
    /// agree on `count` live members with min(count, 3) voters.
    pub fn form(count: usize, extra: &[&str]) -> (Cluster, View) {
        Cluster::with_args(extra).form_nodes(count)
    }

    /// Forms `count` nodes of this (empty) cluster, with its extra args and environment.
    pub fn form_nodes(mut self, count: usize) -> (Cluster, View) {
        assert!(self.nodes.is_empty(), "form_nodes starts from an empty cluster");
        let c = &mut self;
        let started = Instant::now();
        c.spawn("n1", Start::Bootstrap);
        for k in 2..=count {
            let i = c.spawn(&format!("n{k}"), Start::Standby);
            c.join(0, i);
        }
        let all: Vec<usize> = (0..count).collect();
        let names: Vec<String> = c.nodes.iter().map(|n| n.name.clone()).collect();
        let view = c.wait_agreement(&all, TIMING.settle_bound(), &format!("{count} nodes to agree"), |v| {
            v.members.len() == count
                && v.voters() == count.min(3)
                && v.all_live()
                && v.ring_live == names
                && !v.cluster_id.is_empty()
        });
        // Live in every view is not yet serving: a node serves once its own first renewal's
        // answer came back (a renewal that timed out and committed anyway is followed by another).
        all.iter().for_each(|&i| c.wait_ready(i));
        println!("[harness] formed {count}-node cluster in {:?}", started.elapsed());
        (self, view)
    }
}

/// A cheap, `Send + Clone` handle for claims/routes/status from background threads (the `Cluster`
/// itself stays with the test thread, which needs `&mut` to spawn and kill).
#[derive(Clone)]
pub struct Api {
    bearer: String,
}

impl Api {
    pub fn try_claim(
        &self,
        addr: SocketAddr,
        device: &str,
        conn: u64,
        epoch: u64,
        attempt: u64,
    ) -> anyhow::Result<(u16, Value)> {
        let body = serde_json::to_vec(&json!({ "conn": conn, "epoch": epoch, "attempt": attempt })).unwrap();
        let r = http::request(
            addr,
            "POST",
            &format!("/v1/devices/{device}/claim"),
            &[("Authorization", &self.bearer), ("Content-Type", "application/json")],
            Some(&body),
            http::REQUEST_TIMEOUT,
        )?;
        Ok((r.status, r.json()))
    }

    /// `GET /cluster/status` at `addr`.
    pub fn status(&self, addr: SocketAddr) -> anyhow::Result<Value> {
        let r = http::request(
            addr,
            "GET",
            "/cluster/status",
            &[("Authorization", &self.bearer)],
            None,
            http::REQUEST_TIMEOUT,
        )?;
        anyhow::ensure!(r.status == 200, "status {}", r.status);
        Ok(r.json())
    }

    pub fn try_route(&self, addr: SocketAddr, device: &str) -> anyhow::Result<(u16, Value)> {
        let r = http::request(
            addr,
            "GET",
            &format!("/v1/devices/{device}/route"),
            &[("Authorization", &self.bearer)],
            None,
            http::REQUEST_TIMEOUT,
        )?;
        Ok((r.status, r.json()))
    }
}

impl Cluster {
    pub fn api(&self) -> Api {
        Api { bearer: self.bearer() }
    }

    /// Waits until node `i` has applied at least `index` (e.g. the leader's commit index at some
    /// point), so local reads on it reflect everything committed up to then.
    pub fn wait_applied(&self, i: usize, index: u64, bound: Duration) {
        let name = self.nodes[i].name.clone();
        wait_until(bound, &format!("{name} to apply up to {index}"), || {
            let s = self.try_status(i)?;
            match status::applied_index(&s) {
                Some(a) if a >= index => Ok(()),
                other => Err(format!("applied_index {other:?}")),
            }
        });
    }

    /// The commit index of the current leader as seen from node `via`'s status of the leader (asks
    /// the leader itself when it is one of ours).
    pub fn leader_commit_index(&self, via: usize) -> u64 {
        wait_until(TIMING.settle_bound(), "the leader's commit index", || {
            let s = self.try_status(via)?;
            let leader = s["leader"]["id"].as_u64().ok_or_else(|| format!("no leader in {s}"))?;
            for j in 0..self.nodes.len() {
                if let Ok(ls) = self.try_status(j) {
                    if status::node_id(&ls) == Some(leader) {
                        return status::commit_index(&ls).ok_or_else(|| format!("no commit_index in {ls}"));
                    }
                }
            }
            Err(format!("leader {leader} not reachable"))
        })
    }
}

/// The node id a route or claim reply names.
pub fn reply_node_id(v: &Value) -> Option<u64> {
    v["node"]["id"].as_u64()
}
