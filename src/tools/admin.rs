//! Client of the admin API, used by the CLI (`join`, `leave`, `status`, `watch`) and by
//! `serve --join`. Join runs in visible steps: learner, catching up, voter.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::http::{HttpClient, HttpError};
use crate::machine::NodeId;
use crate::wire::{IdentityReply, JoinRequest, LeaveRequest, MembershipSummary, PromoteRequest, StatusReport};

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("{addr} refused: {status} {reason}: {message}")]
    Refused { addr: String, status: u16, reason: String, message: String },
    #[error("unexpected answer from {addr}: {reason}")]
    Decode { addr: String, reason: String },
    #[error("{0}")]
    Other(String),
}

impl AdminError {
    /// The refusal reason (`clash`, `unauthorized`, ...), if the server refused.
    pub fn reason(&self) -> Option<&str> {
        match self {
            AdminError::Refused { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
    #[serde(default)]
    message: String,
}

/// An admin API client bound to one cluster address.
#[derive(Clone)]
pub struct Admin {
    http: HttpClient,
}

impl Admin {
    pub fn new(http: HttpClient) -> Admin {
        Admin { http }
    }

    pub(super) fn http(&self) -> &HttpClient {
        &self.http
    }

    pub(super) async fn parse<T: DeserializeOwned>(
        &self,
        addr: &str,
        res: Result<(hyper::StatusCode, bytes::Bytes), HttpError>,
    ) -> Result<T, AdminError> {
        let (status, body) = res?;
        if !status.is_success() {
            let e: ErrorBody = serde_json::from_slice(&body)
                .unwrap_or(ErrorBody { error: "http".into(), message: String::from_utf8_lossy(&body).into_owned() });
            if status == hyper::StatusCode::UNAUTHORIZED {
                return Err(AdminError::Refused {
                    addr: addr.into(),
                    status: status.as_u16(),
                    reason: e.error,
                    message: "the cluster secret was refused: use the cluster's secret (--cluster-secret-file or GATEWAY_CLUSTER_SECRET)".into(),
                });
            }
            return Err(AdminError::Refused {
                addr: addr.into(),
                status: status.as_u16(),
                reason: e.error,
                message: e.message,
            });
        }
        serde_json::from_slice(&body).map_err(|e| AdminError::Decode { addr: addr.into(), reason: e.to_string() })
    }

    pub async fn status(&self, addr: &str) -> Result<StatusReport, AdminError> {
        let res = self.http.get(addr, "/cluster/status", CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    pub async fn identity(&self, addr: &str) -> Result<IdentityReply, AdminError> {
        let res = self.http.get(addr, "/cluster/identity", CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// Sets the cluster-wide admission budget (`Some((rate, burst))`) or clears it (`None`).
    pub async fn set_admission(&self, addr: &str, budget: Option<(f64, u32)>) -> Result<serde_json::Value, AdminError> {
        let body = match budget {
            Some((rate, burst)) => serde_json::json!({ "rate": rate, "burst": burst }),
            None => serde_json::json!({ "clear": true }),
        };
        let res = self.http.post_json(addr, "/cluster/admission", &body, CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// Sets a tenant's plan: `POST /cluster/tenants/{tenant}`.
    pub async fn set_quota(
        &self,
        addr: &str,
        tenant: &str,
        plan: &serde_json::Value,
    ) -> Result<serde_json::Value, AdminError> {
        let res = self.http.post_json(addr, &format!("/cluster/tenants/{tenant}"), plan, CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// Grants a tenant more publishes this period, once per `id`.
    pub async fn grant(
        &self,
        addr: &str,
        tenant: &str,
        id: &str,
        publishes: u64,
    ) -> Result<serde_json::Value, AdminError> {
        let body = serde_json::json!({ "id": id, "publishes": publishes });
        let res = self.http.post_json(addr, &format!("/cluster/tenants/{tenant}/grants"), &body, CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// A tenant's plan, usage and ledger.
    pub async fn quota(&self, addr: &str, tenant: &str) -> Result<serde_json::Value, AdminError> {
        let res = self.http.get(addr, &format!("/cluster/tenants/{tenant}"), CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// Asks the node at `addr` to drain.
    pub async fn drain(&self, addr: &str) -> Result<serde_json::Value, AdminError> {
        let res = self.http.post_json(addr, "/cluster/drain", &serde_json::json!({}), CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// Waits until the draining node at `addr` has exited, reporting its remaining connections.
    pub async fn wait_drained(&self, addr: &str, progress: &mut (dyn FnMut(&str) + Send)) -> Result<(), AdminError> {
        let mut last = None;
        loop {
            match self.status(addr).await {
                Ok(s) => {
                    let me = s.members.iter().find(|m| m.id == s.node.id);
                    let line = me
                        .map(|m| format!("{}: {} {} connections, {} routes", m.name, m.state, m.connections, m.routes));
                    if line.is_some() && line != last {
                        progress(line.as_deref().unwrap_or_default());
                        last = line;
                    }
                }
                Err(AdminError::Http(HttpError::Connect { .. })) => {
                    progress(&format!("{addr}: drained and stopped"));
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    pub async fn leave(&self, addr: &str, node: &str) -> Result<LeaveReply, AdminError> {
        let res = self.http.post_json(addr, "/cluster/leave", &LeaveRequest { node: node.into() }, CALL_TIMEOUT).await;
        self.parse(addr, res).await
    }

    /// Adds the node listening at `node_addr` to the cluster at `cluster_addr`, reporting each step
    /// through `progress`. A node that already is a member is left as it is.
    pub async fn join(
        &self,
        cluster_addr: &str,
        node_addr: &str,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<JoinOutcome, AdminError> {
        let ident = self.identity(node_addr).await?;
        let (id, name) = (ident.id, ident.member.name.clone());
        let before = self.status(cluster_addr).await?;
        if let (Some(theirs), Some(ours)) = (&ident.cluster_id, &before.cluster_id) {
            if theirs != ours && !before.members.iter().any(|m| m.id == id) {
                return Err(AdminError::Other(format!(
                    "{name} (id {id}) at {node_addr} already belongs to another cluster ({theirs}); start it with a fresh data dir and --standby"
                )));
            }
        }
        if let Some(m) = before.members.iter().find(|m| m.id == id) {
            if m.role == "voter" {
                progress(&format!("{name} (id {id}) is already a voter; nothing to do"));
                return Ok(JoinOutcome {
                    id,
                    name: name.to_string(),
                    role: "voter".into(),
                    changed: false,
                    membership: self.summary(cluster_addr).await?,
                });
            }
        }
        progress(&format!("adding {name} (id {id}, {node_addr}) as a learner"));
        let req = JoinRequest { id, member: ident.member.clone() };
        let res = self.http.post_json(cluster_addr, "/cluster/join", &req, CALL_TIMEOUT).await;
        let added: JoinReply = self.parse(cluster_addr, res).await?;
        let changed = added.outcome == "learner_added";
        self.catch_up(cluster_addr, id, progress).await?;
        let res = self.http.post_json(cluster_addr, "/cluster/promote", &PromoteRequest { id }, CALL_TIMEOUT).await;
        let promoted: PromoteReply = self.parse(cluster_addr, res).await?;
        if promoted.role == "voter" {
            progress(&format!("{name} is a voter"));
        } else {
            progress(&format!("{name} stays a learner: the voter slots are full (it still receives the whole state)"));
        }
        Ok(JoinOutcome { id, name: name.to_string(), role: promoted.role, changed, membership: promoted.membership })
    }

    async fn summary(&self, cluster_addr: &str) -> Result<MembershipSummary, AdminError> {
        let s = self.status(cluster_addr).await?;
        let mut out = MembershipSummary::default();
        for m in s.members {
            let e = (m.id, m.name);
            if m.role == "voter" {
                out.voters.push(e)
            } else {
                out.learners.push(e)
            }
        }
        Ok(out)
    }

    /// Waits until the leader has replicated its log (as of the first look) to `id`.
    async fn catch_up(
        &self,
        cluster_addr: &str,
        id: NodeId,
        progress: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), AdminError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        let mut target = None;
        let mut last_said = None;
        loop {
            let any = self.status(cluster_addr).await?;
            let leader_addr = any
                .leader
                .as_ref()
                .and_then(|l| any.members.iter().find(|m| m.id == l.id))
                .map(|m| m.cluster_addr.clone());
            if let Some(leader_addr) = leader_addr {
                let st = self.status(&leader_addr).await?;
                let target = *target.get_or_insert(st.last_log_index);
                let matched = st.members.iter().find(|m| m.id == id).and_then(|m| m.matched_index).unwrap_or(0);
                if last_said != Some(matched) {
                    progress(&format!("catching up: replicated {matched} of {target} log entries"));
                    last_said = Some(matched);
                }
                if matched >= target {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(AdminError::Other(format!("node {id} did not catch up within 120 s")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[derive(Debug, Deserialize)]
struct JoinReply {
    outcome: String,
}

#[derive(Debug, Deserialize)]
struct PromoteReply {
    role: String,
    membership: MembershipSummary,
}

#[derive(Debug, Deserialize)]
pub struct LeaveReply {
    pub removed: NodeId,
    pub membership: MembershipSummary,
}

/// What `join` did.
#[derive(Debug)]
pub struct JoinOutcome {
    pub id: NodeId,
    pub name: String,
    pub role: String,
    /// False when the node already was a member.
    pub changed: bool,
    pub membership: MembershipSummary,
}

/// What a join does when the cluster refuses it for a name or address clash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnClash {
    /// Stop asking (`serve --join`: the operator fixes the clash and restarts).
    GiveUp,
    /// Keep asking, slowly: the bootstrap guard's join goes through once the operator removed the
    /// old identity (`gateway leave`), without a restart.
    Retry,
}

/// `serve --join ADDR`: asks the member at `cluster_addr` to add this node, retrying with backoff
/// until it is a member with its final role.
pub async fn join_until_member(
    http: &HttpClient,
    cluster_addr: &str,
    me_addr: &str,
    id: NodeId,
    on_clash: OnClash,
    cancel: CancellationToken,
) {
    let admin = Admin::new(http.clone());
    let mut backoff = Duration::from_millis(200);
    loop {
        let mut say = |line: &str| tracing::info!(node = id, "join: {line}");
        match admin.join(cluster_addr, me_addr, &mut say).await {
            Ok(out) => {
                tracing::info!(role = %out.role, "joined the cluster via {cluster_addr}");
                return;
            }
            Err(e) if e.reason() == Some("clash") && on_clash == OnClash::GiveUp => {
                tracing::error!(error = %e, "join refused; fix the clash and restart");
                return;
            }
            Err(e) if e.reason() == Some("clash") => {
                tracing::error!(error = %e, "join refused: an old identity of this node is still a member; remove it with `gateway leave --cluster {cluster_addr} --node <old id>` and this node joins by itself (retrying in {backoff:?})");
            }
            Err(e) => tracing::warn!(error = %e, "join via {cluster_addr} failed; retrying in {backoff:?}"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
