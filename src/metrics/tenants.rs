//! Per-tenant usage against its plan, refreshed from the applied state by each `/metrics` scrape
//! and encoded from that copy. The export is bounded: at most [`EXPORTED`] tenants (those with
//! the most connections), so a fleet of many tenants costs a scrape a fixed number of series;
//! `gateway_tenants` says how many there are in all.

use std::fmt::Error as FmtError;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// Most tenants exported (each at most five series of a label of 64 bytes at most: ~150 KB).
pub const EXPORTED: usize = 256;

/// One tenant's figures as applied on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantUsage {
    pub tenant: String,
    /// Its devices' routes, cluster-wide.
    pub connections: u64,
    /// The plan's connection cap, if it has one.
    pub max_connections: Option<u64>,
    /// Publishes counted in the current period (0 once a period ended with no publish since).
    pub publishes_used: u64,
    /// Publishes allowed this period (limit plus grants), if it has a publish quota.
    pub publishes_allowance: Option<u64>,
}

#[derive(Debug, Default)]
struct Snapshot {
    total: u64,
    rows: Vec<TenantUsage>,
}

/// The collector registered in the node's registry; [`TenantGauges::set`] replaces its copy.
#[derive(Debug, Clone, Default)]
pub struct TenantGauges(Arc<Mutex<Snapshot>>);

impl TenantGauges {
    /// `total` tenants in the state; `rows` the exported ones (cut to [`EXPORTED`]).
    pub fn set(&self, total: u64, mut rows: Vec<TenantUsage>) {
        rows.truncate(EXPORTED);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Snapshot { total, rows };
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct TenantLabel {
    tenant: String,
}

type Pick = fn(&TenantUsage) -> Option<u64>;

impl Collector for TenantGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), FmtError> {
        let snap = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = |n: u64| ConstGauge::new(n.min(i64::MAX as u64) as i64);
        let total = count(snap.total);
        total.encode(encoder.encode_descriptor(
            "tenants",
            "Tenants in the applied state",
            None,
            total.metric_type(),
        )?)?;
        let exported = count(snap.rows.len() as u64);
        let help = "Tenants exported per tenant (those with the most connections)";
        exported.encode(encoder.encode_descriptor("tenants_exported", help, None, exported.metric_type())?)?;
        let families: [(&str, &str, Pick); 4] = [
            ("tenant_connections", "A tenant's connections (its devices' routes)", |u| Some(u.connections)),
            ("tenant_max_connections", "A tenant's connection cap", |u| u.max_connections),
            ("tenant_publishes_used", "Publishes a tenant used this period", |u| Some(u.publishes_used)),
            ("tenant_publishes_allowance", "Publishes a tenant may make this period", |u| u.publishes_allowance),
        ];
        for (name, help, pick) in families {
            let mut family = encoder.encode_descriptor(name, help, None, count(0).metric_type())?;
            for u in snap.rows.iter() {
                if let Some(v) = pick(u) {
                    count(v).encode(family.encode_family(&TenantLabel { tenant: u.tenant.clone() })?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn usage(tenant: &str, connections: u64) -> TenantUsage {
        TenantUsage {
            tenant: tenant.into(),
            connections,
            max_connections: Some(10),
            publishes_used: 3,
            publishes_allowance: None,
        }
    }

    #[test]
    fn exports_each_tenant_and_stays_bounded() {
        let gauges = TenantGauges::default();
        let mut registry = Registry::with_prefix("gateway");
        registry.register_collector(Box::new(gauges.clone()));
        let rows: Vec<TenantUsage> = (0..EXPORTED as u64 + 50).map(|i| usage(&format!("t{i}"), i)).collect();
        gauges.set(10_000, rows);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("gateway_tenants 10000"), "{text}");
        assert!(text.contains(&format!("gateway_tenants_exported {EXPORTED}")), "{text}");
        assert!(text.contains("gateway_tenant_connections{tenant=\"t7\"} 7"), "{text}");
        assert!(text.contains("gateway_tenant_max_connections{tenant=\"t7\"} 10"), "{text}");
        assert!(!text.contains("tenant_publishes_allowance{"), "no quota, no series: {text}");
        let series = text.lines().filter(|l| l.starts_with("gateway_tenant_connections{")).count();
        assert_eq!(series, EXPORTED);
        // A tenant gone from the state is gone from the next scrape.
        gauges.set(1, vec![usage("only", 1)]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("tenant=\"t7\""), "{text}");
        assert!(text.contains("gateway_tenant_connections{tenant=\"only\"} 1"), "{text}");
    }
}
