//! Tenants and their quotas (issue 12): a device token may name a tenant; per tenant a cap on
//! concurrent connections (its devices' routes, cluster-wide) and a publish quota per period.
//! Quotas are a ledger, not a rate limit: every consumption is an entry keyed by (tenant, period,
//! consumption id) under the policy revision in force, so a retry consumes once; a grant or a
//! plan change adds an entry, never rewrites a count. The ledger keeps the current and the
//! previous period of a tenant; older entries go at the tenant's first entry of a new period.

use serde::{Deserialize, Serialize};

use super::{Apply, Ctx, Tables};

/// Publishes allowed per period (periods are `at_ms / period_ms`, in cluster time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishQuota {
    pub limit: u64,
    pub period_ms: u64,
}

/// A tenant's plan; `revision` counts its changes. `None` is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub revision: u64,
    pub max_connections: Option<u64>,
    pub publishes: Option<PublishQuota>,
}

/// A tenant's row: its plan, its devices' routes now, and the totals of its current period.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRow {
    pub policy: Policy,
    pub connections: u64,
    /// The period `used` and `granted` count (`at_ms / period_ms`).
    pub period: u64,
    pub used: u64,
    pub granted: u64,
}

impl TenantRow {
    /// Publishes allowed this period: the plan's limit plus what was granted.
    pub fn allowance(&self) -> Option<u64> {
        self.policy.publishes.map(|q| q.limit.saturating_add(self.granted))
    }

    /// This row as of cluster time `at_ms`: a copy moved to that period, as the next publish
    /// would find it (a period that ended since counts nothing used and no grants).
    pub fn as_of(&self, at_ms: u64) -> TenantRow {
        let mut row = self.clone();
        if let Some(q) = row.policy.publishes {
            let period = at_ms / q.period_ms.max(1);
            if period != row.period {
                (row.period, row.used, row.granted) = (period, 0, 0);
            }
        }
        row
    }

    /// When the current period ends, in cluster ms.
    pub fn period_end_ms(&self) -> Option<u64> {
        self.policy.publishes.map(|q| self.period.saturating_add(1).saturating_mul(q.period_ms))
    }
}

/// What a ledger entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A publish to one of the tenant's devices.
    Consume,
    /// Extra publishes for this period (`gateway quota grant`).
    Grant,
    /// The plan changed (to `revision`): counts carry on.
    Plan,
}

/// One ledger entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    pub publishes: u64,
    pub revision: u64,
    pub at_ms: u64,
}

/// A publish refused by its tenant's quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exhausted {
    pub allowance: u64,
    pub period_end_ms: u64,
    /// Until the period ends, from the publish's own stamp.
    pub retry_after_ms: u64,
}

/// Sets a tenant's plan (a new revision); counts of the current period carry on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetTenantPolicy {
    pub tenant: String,
    pub max_connections: Option<u64>,
    pub publishes: Option<PublishQuota>,
    pub at_ms: u64,
}

impl Apply for SetTenantPolicy {
    type Reply = u64;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<u64, T::Error> {
        let t = &mut *cx.tables;
        let mut row = t.tenant(&self.tenant)?.unwrap_or_default();
        row.policy = Policy {
            revision: row.policy.revision + 1,
            max_connections: self.max_connections,
            publishes: self.publishes,
        };
        roll_period(t, &self.tenant, &mut row, self.at_ms)?;
        let id = format!("plan:{}", row.policy.revision);
        let entry = Entry { kind: EntryKind::Plan, publishes: 0, revision: row.policy.revision, at_ms: self.at_ms };
        t.put_ledger(&self.tenant, row.period, &id, &entry)?;
        t.put_tenant(&self.tenant, &row)?;
        Ok(row.policy.revision)
    }
}

/// Grants a tenant `publishes` more this period, once per `id` (a retried grant counts once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub tenant: String,
    pub id: String,
    pub publishes: u64,
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GrantReply {
    /// The tenant's row after the grant; `duplicate` when this id was granted before.
    Granted { row: TenantRow, duplicate: bool },
    /// The tenant has no publish quota to add to.
    NoQuota,
}

impl Apply for Grant {
    type Reply = GrantReply;

    fn apply<T: Tables>(&self, cx: &mut Ctx<'_, T>) -> Result<GrantReply, T::Error> {
        let t = &mut *cx.tables;
        let Some(mut row) = t.tenant(&self.tenant)?.filter(|r| r.policy.publishes.is_some()) else {
            return Ok(GrantReply::NoQuota);
        };
        roll_period(t, &self.tenant, &mut row, self.at_ms)?;
        let id = format!("grant:{}", self.id);
        let duplicate = t.ledger(&self.tenant, row.period, &id)?.is_some();
        if !duplicate {
            let entry = Entry {
                kind: EntryKind::Grant,
                publishes: self.publishes,
                revision: row.policy.revision,
                at_ms: self.at_ms,
            };
            t.put_ledger(&self.tenant, row.period, &id, &entry)?;
            row.granted = row.granted.saturating_add(self.publishes);
        }
        t.put_tenant(&self.tenant, &row)?;
        Ok(GrantReply::Granted { row, duplicate })
    }
}

/// Moves `row` to the period of `at_ms`: a new period starts from zero, and the ledger keeps
/// only the previous one besides.
fn roll_period<T: Tables>(t: &mut T, tenant: &str, row: &mut TenantRow, at_ms: u64) -> Result<(), T::Error> {
    let rolled = row.as_of(at_ms);
    if rolled.period != row.period {
        *row = rolled;
        t.prune_ledger(tenant, row.period.saturating_sub(1))?;
    }
    Ok(())
}

/// Records one publish to a device of `tenant` under `id`, unless its allowance is used up. A
/// consumption id seen before in this period counts nothing more.
pub(super) fn consume<T: Tables>(
    t: &mut T,
    tenant: &str,
    id: &str,
    at_ms: u64,
) -> Result<Result<(), Exhausted>, T::Error> {
    let Some(mut row) = t.tenant(tenant)? else { return Ok(Ok(())) };
    let Some(q) = row.policy.publishes else { return Ok(Ok(())) };
    roll_period(t, tenant, &mut row, at_ms)?;
    if t.ledger(tenant, row.period, id)?.is_none() {
        let allowance = q.limit.saturating_add(row.granted);
        if row.used >= allowance {
            let period_end_ms = row.period.saturating_add(1).saturating_mul(q.period_ms);
            t.put_tenant(tenant, &row)?;
            return Ok(Err(Exhausted {
                allowance,
                period_end_ms,
                retry_after_ms: period_end_ms.saturating_sub(at_ms),
            }));
        }
        let entry = Entry { kind: EntryKind::Consume, publishes: 1, revision: row.policy.revision, at_ms };
        t.put_ledger(tenant, row.period, id, &entry)?;
        row.used += 1;
    }
    t.put_tenant(tenant, &row)?;
    Ok(Ok(()))
}

/// Whether a new connection of `tenant` fits its cap: `Err(cap)` when it does not.
pub(super) fn admits_connection<T: Tables>(t: &T, tenant: &str) -> Result<Result<(), u64>, T::Error> {
    let row = t.tenant(tenant)?.unwrap_or_default();
    Ok(match row.policy.max_connections {
        Some(cap) if row.connections >= cap => Err(cap),
        _ => Ok(()),
    })
}

/// One more (`+1`) or one fewer (`-1`) route of `tenant`.
pub(super) fn count_route<T: Tables>(t: &mut T, tenant: &str, delta: i64) -> Result<(), T::Error> {
    let mut row = t.tenant(tenant)?.unwrap_or_default();
    row.connections = row.connections.saturating_add_signed(delta);
    t.put_tenant(tenant, &row)
}
