//! `/cluster/tenants/{tenant}`: a tenant's plan (connection cap, publish quota per period), its
//! usage and ledger, and grants. Cluster secret only.

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json as j, Value};

use super::{bad_json, error, Api};
use crate::answer::{self, json, Resp};
use crate::machine::{GrantReply, PublishQuota, TenantRow};
use crate::token::valid_tenant;

/// Ledger entries shown by `GET`: the last ones in (period, id) order.
const SHOWN_ENTRIES: usize = 50;
/// Largest publish limit or grant in one period: the ledger holds an entry per publish, for two
/// periods, so this bounds a tenant's ledger (about 100 bytes an entry).
pub const MAX_PUBLISHES: u64 = 10_000_000;

fn bad_tenant() -> Resp {
    error(StatusCode::BAD_REQUEST, "bad_tenant", "tenants are 1-64 characters of [A-Za-z0-9._-]")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyRequest {
    max_connections: Option<u64>,
    publishes: Option<u64>,
    period_ms: Option<u64>,
}

/// `POST /cluster/tenants/{tenant}` `{"max_connections": N?, "publishes": N?, "period_ms": P?}`:
/// a new plan (absent = unlimited); counts of the current period carry on.
pub async fn set_policy(api: &Api, tenant: &str, body: &[u8]) -> Resp {
    if !valid_tenant(tenant) {
        return bad_tenant();
    }
    let req: PolicyRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    let publishes = match (req.publishes, req.period_ms) {
        (None, None) => None,
        (Some(limit), Some(period_ms))
            if limit <= MAX_PUBLISHES && (1000..=crate::config::MAX_DURATION_MS).contains(&period_ms) =>
        {
            Some(PublishQuota { limit, period_ms })
        }
        _ => {
            let msg = format!("publishes (0..={MAX_PUBLISHES}) and period_ms (1000..=2^40) go together");
            return error(StatusCode::BAD_REQUEST, "bad_policy", msg);
        }
    };
    match api.cluster.set_tenant_policy(tenant, req.max_connections, publishes).await {
        Ok(revision) => {
            tracing::info!(tenant, revision, "tenant plan set over the admin API");
            json(StatusCode::OK, &j!({ "tenant": tenant, "revision": revision }))
        }
        Err(e) => answer::operator_write_error(&e).response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantRequest {
    id: String,
    publishes: u64,
}

/// `POST /cluster/tenants/{tenant}/grants` `{"id": "...", "publishes": N}`: N more publishes
/// this period, once per id.
pub async fn grant(api: &Api, tenant: &str, body: &[u8]) -> Resp {
    if !valid_tenant(tenant) {
        return bad_tenant();
    }
    let req: GrantRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return bad_json(&e),
    };
    if !valid_tenant(&req.id) || req.publishes == 0 || req.publishes > MAX_PUBLISHES {
        let msg = format!("id: 1-64 characters of [A-Za-z0-9._-]; publishes: 1..={MAX_PUBLISHES}");
        return error(StatusCode::BAD_REQUEST, "bad_grant", msg);
    }
    match api.cluster.grant(tenant, &req.id, req.publishes).await {
        Ok(GrantReply::Granted { row, duplicate }) => {
            json(StatusCode::OK, &j!({ "tenant": tenant, "duplicate": duplicate, "usage": usage(&row) }))
        }
        Ok(GrantReply::NoQuota) => {
            error(StatusCode::CONFLICT, "no_quota", "this tenant has no publish quota to add to")
        }
        Err(e) => answer::operator_write_error(&e).response(),
    }
}

/// `GET /cluster/tenants/{tenant}`: plan, usage, and the last ledger entries, as applied here.
pub async fn show(api: &Api, tenant: &str) -> Resp {
    if !valid_tenant(tenant) {
        return bad_tenant();
    }
    match api.cluster.tenant(tenant, SHOWN_ENTRIES).await {
        Ok((row, entries)) => {
            let row = row.unwrap_or_default();
            let ledger: Vec<Value> = entries
                .into_iter()
                .map(|(period, id, e)| {
                    j!({"period": period, "id": id, "kind": format!("{:?}", e.kind).to_lowercase(),
                        "publishes": e.publishes, "revision": e.revision, "at_ms": e.at_ms})
                })
                .collect();
            json(StatusCode::OK, &j!({ "tenant": tenant, "usage": usage(&row), "ledger": ledger }))
        }
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, "read_failed", e),
    }
}

/// A row as JSON: plan, connections, and the current period's counts.
fn usage(row: &TenantRow) -> Value {
    let p = &row.policy;
    j!({
        "revision": p.revision,
        "max_connections": p.max_connections,
        "connections": row.connections,
        "publishes": p.publishes.map(|q| q.limit),
        "period_ms": p.publishes.map(|q| q.period_ms),
        "period": p.publishes.map(|_| row.period),
        "period_end_ms": row.period_end_ms(),
        "used": row.used,
        "granted": row.granted,
        "allowance": row.allowance(),
    })
}
