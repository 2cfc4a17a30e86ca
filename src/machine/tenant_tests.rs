//! Rule tests of tenants and quotas (issue 12), generic over the backend like [`super::tests`]:
//! the connection cap counted over every way a route comes and goes, the publish ledger (a retry
//! consumes once, grants once per id, periods renew and old ones are pruned, a plan change keeps
//! the counts), and all of it through a reopen and a snapshot.

use super::testkit::*;
use super::tests::sm_with;
use super::*;

fn claim_as(device: &str, conn: u64, attempt: u64, tenant: &str) -> Command {
    let claim = Claim { device: device.into(), node: 1, conn, epoch: 0, attempt };
    ClaimTenant { claim, tenant: tenant.into() }.into()
}

fn plan(tenant: &str, max_connections: Option<u64>, publishes: Option<(u64, u64)>, at_ms: u64) -> Command {
    let publishes = publishes.map(|(limit, period_ms)| PublishQuota { limit, period_ms });
    SetTenantPolicy { tenant: tenant.into(), max_connections, publishes, at_ms }.into()
}

fn grant(tenant: &str, id: &str, publishes: u64, at_ms: u64) -> Command {
    Grant { tenant: tenant.into(), id: id.into(), publishes, at_ms }.into()
}

fn row<B: Backend>(sm: &Sm<B>, tenant: &str) -> TenantRow {
    sm.b.dump().tenants.get(tenant).cloned().unwrap_or_default()
}

fn is_accepted(r: &Reply) -> bool {
    matches!(r, Reply::Claim(ClaimReply::Accepted { .. }) | Reply::ClaimTenant(ClaimReply::Accepted { .. }))
}

fn exhausted(r: &Reply) -> Option<Exhausted> {
    match r {
        Reply::Publish(PublishReply::QuotaExhausted(e)) => Some(*e),
        _ => None,
    }
}

pub fn a_tenant_at_its_connection_cap_is_refused_and_others_are_not<B: Backend>() {
    let mut sm = sm_with::<B>(&[]);
    assert_eq!(sm.one(plan("acme", Some(2), None, 0)), Reply::SetTenantPolicy(1));
    assert!(is_accepted(&sm.one(claim_as("d1", 1, 1, "acme"))));
    assert!(is_accepted(&sm.one(claim_as("d2", 2, 1, "acme"))));
    let before = sm.everything();
    assert_eq!(sm.one(claim_as("d3", 3, 1, "acme")), Reply::ClaimTenant(ClaimReply::QuotaExhausted { limit: 2 }));
    assert_eq!(sm.everything(), before, "a refused claim changed state (a floor would fence the device)");
    assert!(is_accepted(&sm.one(claim_as("d3", 3, 1, "other"))), "another tenant is not capped");
    // A device that holds a slot reconnects (a takeover) without taking a second one.
    assert!(is_accepted(&sm.one(claim_as("d1", 4, 2, "acme"))));
    assert_eq!(row(&sm, "acme").connections, 2);
    // A release frees a slot; d3 moves from "other" to "acme".
    assert_eq!(sm.one(Release { device: "d2".into(), conn: 2 }.into()), Reply::Release(true));
    assert!(is_accepted(&sm.one(claim_as("d3", 5, 2, "acme"))));
    assert_eq!((row(&sm, "acme").connections, row(&sm, "other").connections), (2, 0));
    // A claim without a tenant leaves the tenant's count.
    assert!(is_accepted(&sm.one(claim("d3", 1, 6, 0, 3))));
    assert_eq!(row(&sm, "acme").connections, 1);
    // A sweep of the node frees every slot its routes held.
    assert!(is_accepted(&sm.one(claim_as("d4", 7, 1, "acme"))));
    sm.one(renew(2, 0, 1 << 40));
    sm.one(ReleaseNode { node: 1 }.into());
    assert_eq!(row(&sm, "acme").connections, 0);
    // Lowering the cap below the count refuses new devices only.
    sm.one(renew(1, 0, 1 << 41));
    assert!(is_accepted(&sm.one(claim_as("d5", 8, 1, "acme"))));
    assert_eq!(sm.one(plan("acme", Some(0), None, 10)), Reply::SetTenantPolicy(2));
    assert!(is_accepted(&sm.one(claim_as("d5", 9, 2, "acme"))), "d5 keeps its slot");
    assert_eq!(sm.one(claim_as("d6", 10, 1, "acme")), Reply::ClaimTenant(ClaimReply::QuotaExhausted { limit: 0 }));
}

pub fn a_publish_quota_counts_each_consumption_once_and_renews_each_period<B: Backend>() {
    let mut sm = sm_with::<B>(&[]);
    sm.one(plan("acme", None, Some((3, 1_000)), 0));
    assert!(is_accepted(&sm.one(claim_as("d1", 1, 1, "acme"))));
    assert!(is_accepted(&sm.one(claim_as("free", 2, 1, "other"))));
    // A keyed publish retried five times consumes once.
    for i in 0..5 {
        assert_eq!(sm.one(publish_keyed("d1", "p", "k1", 100, u64::MAX, 100)), published(1, i > 0));
    }
    assert_eq!(row(&sm, "acme").used, 1);
    assert_eq!(sm.one(publish("d1", "p", None, 200, 100, u64::MAX)), published(2, false));
    assert_eq!(sm.one(publish("d1", "p", None, 300, 100, u64::MAX)), published(3, false));
    let before = sm.everything();
    let e = exhausted(&sm.one(publish("d1", "p", None, 400, 100, u64::MAX))).expect("the 4th publish is refused");
    assert_eq!(e, Exhausted { allowance: 3, period_end_ms: 1_000, retry_after_ms: 600 });
    assert_eq!(sm.everything(), before, "a refused publish changed state");
    // The other tenant has no quota.
    for at in 0..5 {
        assert!(matches!(
            sm.one(publish("free", "p", None, 400 + at, 100, u64::MAX)),
            Reply::Publish(PublishReply::Published { .. })
        ));
    }
    // A grant adds to this period, once per id.
    let Reply::Grant(GrantReply::Granted { row: r, duplicate: false }) = sm.one(grant("acme", "t-1", 2, 500)) else {
        panic!("grant refused")
    };
    assert_eq!(r.allowance(), Some(5));
    let Reply::Grant(GrantReply::Granted { row: r, duplicate: true }) = sm.one(grant("acme", "t-1", 2, 510)) else {
        panic!("a retried grant is a duplicate")
    };
    assert_eq!(r.allowance(), Some(5));
    assert_eq!(sm.one(publish("d1", "p", None, 600, 100, u64::MAX)), published(4, false));
    assert_eq!(sm.one(grant("other", "t-2", 2, 600)), Reply::Grant(GrantReply::NoQuota));
    // The next period starts from zero; the ledger keeps this one and the previous one only.
    assert_eq!(sm.one(publish("d1", "p", None, 1_500, 100, u64::MAX)), published(5, false));
    let r = row(&sm, "acme");
    assert_eq!((r.period, r.used, r.granted, r.period_end_ms()), (1, 1, 0, Some(2_000)));
    let periods = |sm: &Sm<B>| -> BTreeSet<u64> { sm.b.dump().ledger.keys().map(|(_, p, _)| *p).collect() };
    assert_eq!(periods(&sm), BTreeSet::from([0, 1]));
    sm.one(publish("d1", "p", None, 2_500, 100, u64::MAX));
    assert_eq!(periods(&sm), BTreeSet::from([1, 2]), "period 0 pruned");
    // A plan change is an entry; the period's count carries on.
    assert_eq!(sm.one(plan("acme", None, Some((1, 1_000)), 2_600)), Reply::SetTenantPolicy(2));
    let e = exhausted(&sm.one(publish("d1", "p", None, 2_700, 100, u64::MAX))).expect("1 used of the new limit of 1");
    assert_eq!(e.allowance, 1);
    let kinds: Vec<EntryKind> = sm.b.dump().ledger.values().map(|e| e.kind).collect();
    assert!(kinds.contains(&EntryKind::Plan));
    // No allowance at all.
    sm.one(plan("acme", None, Some((0, 1_000)), 3_000));
    let e = exhausted(&sm.one(publish("d1", "p", None, 3_100, 100, u64::MAX))).unwrap();
    assert_eq!(e.allowance, 0);
}

pub fn tenants_survive_a_reopen_and_a_snapshot<B: Backend>() {
    let mut sm = sm_with::<B>(&[]);
    sm.one(plan("acme", Some(5), Some((10, 1_000)), 0));
    sm.one(claim_as("d1", 1, 1, "acme"));
    sm.one(publish_keyed("d1", "p", "k", 10, u64::MAX, 10));
    sm.one(grant("acme", "g", 3, 20));
    let copy = sm.install_copy();
    assert_eq!(copy.everything(), sm.everything(), "a snapshot lost tenant tables");
    let before = sm.everything();
    let mut sm = sm.reopen();
    assert_eq!(sm.everything(), before);
    // Counting carries on after both.
    assert!(is_accepted(&sm.one(claim_as("d2", 2, 1, "acme"))));
    assert_eq!(row(&sm, "acme").connections, 2);
}
