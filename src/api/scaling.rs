//! Capacity signals and the scaling hint (issue 15). Utilization is read from the applied view
//! (connections travel with lease renewals, each node's declared capacity is replicated), so every
//! node computes the same per-node and cluster figures; the new-connection rate is this node's.
//! [`judge`] is the pure rule; [`follow`] re-evaluates it every second and keeps how long the
//! signals have been low (the sustained period a scale-in needs) on this node's monotonic clock.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterWatch;
use crate::config::ScalingConfig;
use crate::metrics::{Metrics, ResultLabel};
use crate::view::ClusterView;
use crate::wire::ScalingStatus;

/// What the hint is judged on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Signals {
    /// All connections / declared capacity of the live nodes (None: no live node declared one).
    pub cluster_utilization: Option<f64>,
    /// The highest utilization of one live node with a declared capacity.
    pub max_node_utilization: Option<f64>,
    /// Live nodes (the ring).
    pub live: usize,
    /// New connections per second accepted here, and that as a share of this node's admission rate.
    pub new_connections_per_s: f64,
    pub accept_share: Option<f64>,
    /// Share of its CPUs this process used over the last second.
    pub cpu: Option<f64>,
}

/// The raw verdict before the sustained-period rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    ScaleOut,
    /// Every signal below its low-water mark.
    Low,
    Steady,
}

/// Scale out if any signal reaches its high-water mark; low when every one is below its
/// low-water mark and the cluster minus one node would stay below the scale-out mark (so the
/// scale-in does not cause the next scale-out); else steady. The reasons say which marks.
pub fn judge(s: &Signals, c: &ScalingConfig) -> (Verdict, Vec<String>) {
    let mut high = Vec::new();
    if let Some(u) = s.cluster_utilization.filter(|u| *u >= c.scale_out_utilization) {
        high.push(format!("cluster utilization {:.0}% >= {:.0}%", u * 100.0, c.scale_out_utilization * 100.0));
    }
    if let Some(u) = s.max_node_utilization.filter(|u| *u >= c.scale_out_utilization) {
        high.push(format!("a node at {:.0}% >= {:.0}%", u * 100.0, c.scale_out_utilization * 100.0));
    }
    if let Some(a) = s.accept_share.filter(|a| *a >= c.scale_out_accept_share) {
        high.push(format!("accepting at {:.0}% of the admission rate", a * 100.0));
    }
    if let Some(cpu) = s.cpu.filter(|u| *u >= c.scale_out_cpu) {
        high.push(format!("cpu {:.0}% >= {:.0}%", cpu * 100.0, c.scale_out_cpu * 100.0));
    }
    if !high.is_empty() {
        return (Verdict::ScaleOut, high);
    }
    let (Some(cluster), Some(node)) = (s.cluster_utilization, s.max_node_utilization) else {
        return (Verdict::Steady, vec!["no capacity declared (--capacity-connections): utilization unknown".into()]);
    };
    let without_one = if s.live > 1 { cluster * s.live as f64 / (s.live - 1) as f64 } else { f64::INFINITY };
    let low = cluster < c.scale_in_utilization
        && node < c.scale_in_utilization
        && s.accept_share.is_none_or(|a| a < c.scale_in_utilization)
        && s.cpu.is_none_or(|u| u < c.scale_in_utilization)
        && without_one < c.scale_out_utilization;
    if low {
        let why = format!(
            "cluster {:.0}%, busiest node {:.0}%, one node fewer {:.0}%",
            cluster * 100.0,
            node * 100.0,
            without_one * 100.0
        );
        return (Verdict::Low, vec![why]);
    }
    (Verdict::Steady, vec![format!("cluster {:.0}%, busiest node {:.0}%", cluster * 100.0, node * 100.0)])
}

/// Utilization from the applied view.
pub fn utilization(view: &ClusterView) -> (Option<f64>, Option<f64>, usize) {
    let live = view.state.live_set();
    let connections: u64 = view.state.nodes.values().map(|l| l.connections).sum();
    let mut capacity = 0u64;
    let mut max_node: Option<f64> = None;
    for id in &live {
        if let Some(cap) = view.state.capacity.get(id).copied().filter(|c| *c > 0) {
            capacity += cap;
            let u = view.lease(*id).map_or(0, |l| l.connections) as f64 / cap as f64;
            max_node = Some(max_node.map_or(u, |m| m.max(u)));
        }
    }
    let cluster = (capacity > 0).then(|| connections as f64 / capacity as f64);
    (cluster, max_node, live.len())
}

/// The hint as last evaluated, and since when every signal has been low.
#[derive(Debug, Default)]
pub struct Tracker {
    inner: Mutex<Option<ScalingStatus>>,
}

impl Tracker {
    pub fn status(&self) -> Option<ScalingStatus> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// How often the hint is re-evaluated (and the new-connection rate sampled).
const EVERY: Duration = Duration::from_secs(1);

/// Re-evaluates the hint every second until `cancel`; exports it as metrics.
pub async fn follow(
    view: ClusterWatch,
    cfg: ScalingConfig,
    tracker: std::sync::Arc<Tracker>,
    metrics: std::sync::Arc<Metrics>,
    cancel: CancellationToken,
) {
    let accepted = metrics.handshakes.get_or_create(&ResultLabel { result: "accepted" }).clone();
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last, mut rate) = ((Instant::now(), accepted.get()), 0.0f64);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut last_cpu = crate::metrics::process::cpu_seconds();
    let mut low_since: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = (Instant::now(), accepted.get());
        let secs = now.0.duration_since(last.0).as_secs_f64().max(1e-3);
        // A short moving average: a burst of one second does not flip the hint alone.
        rate = 0.5 * rate + 0.5 * (now.1.saturating_sub(last.1) as f64 / secs);
        last = now;
        let cpu_now = crate::metrics::process::cpu_seconds();
        let cpu = cpu_now.zip(last_cpu).map(|(now_s, then_s)| ((now_s - then_s).max(0.0) / secs / cpus).min(1.0));
        last_cpu = cpu_now;
        let (cluster_utilization, max_node_utilization, live) = utilization(&view.borrow());
        let admit = metrics.admission_rate.get();
        let signals = Signals {
            cluster_utilization,
            max_node_utilization,
            live,
            new_connections_per_s: rate,
            accept_share: (admit > 0.0).then(|| rate / admit),
            cpu,
        };
        let (verdict, reasons) = judge(&signals, &cfg);
        low_since = if verdict == Verdict::Low { low_since.or(Some(now.0)) } else { None };
        let low_for = low_since.map(|t| now.0.duration_since(t));
        let sustained = low_for.is_some_and(|d| d >= Duration::from_millis(cfg.scale_in_after_ms));
        let hint = match verdict {
            Verdict::ScaleOut => "scale_out",
            Verdict::Low if sustained => "scale_in",
            _ => "steady",
        };
        metrics.scaling_hint.set(match hint {
            "scale_out" => 1,
            "scale_in" => -1,
            _ => 0,
        });
        metrics.cluster_utilization.set(cluster_utilization.unwrap_or(0.0));
        metrics.new_connections_per_s.set(rate);
        let status = ScalingStatus {
            hint: hint.to_string(),
            reasons,
            cluster_utilization,
            max_node_utilization,
            new_connections_per_s: rate,
            accept_share: signals.accept_share,
            cpu: signals.cpu,
            low_for_ms: low_for.map(|d| d.as_millis() as u64),
            thresholds: cfg.clone(),
        };
        *tracker.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(cluster: f64, node: f64, live: usize, accept: f64) -> Signals {
        Signals {
            cluster_utilization: Some(cluster),
            max_node_utilization: Some(node),
            live,
            new_connections_per_s: 0.0,
            accept_share: Some(accept),
            cpu: Some(0.1),
        }
    }

    #[test]
    fn any_high_signal_scales_out_only_all_low_ones_scale_in() {
        let c = ScalingConfig::default();
        assert_eq!(judge(&signals(0.80, 0.80, 3, 0.0), &c).0, Verdict::ScaleOut);
        assert_eq!(judge(&signals(0.50, 0.95, 3, 0.0), &c).0, Verdict::ScaleOut, "one hot node");
        assert_eq!(judge(&signals(0.10, 0.10, 3, 0.9), &c).0, Verdict::ScaleOut, "admission nearly saturated");
        assert_eq!(judge(&signals(0.20, 0.25, 3, 0.05), &c).0, Verdict::Low);
        assert_eq!(judge(&signals(0.20, 0.35, 3, 0.05), &c).0, Verdict::Steady, "one node above low water");
        assert_eq!(judge(&signals(0.20, 0.25, 3, 0.5), &c).0, Verdict::Steady, "arrivals still busy");
        // Two nodes at 29 %: one node would hold 58 %, below 75 %: low. At 1 node: never.
        assert_eq!(judge(&signals(0.29, 0.29, 2, 0.0), &c).0, Verdict::Low);
        assert_eq!(judge(&signals(0.10, 0.10, 1, 0.0), &c).0, Verdict::Steady);
        let busy_cpu = Signals { cpu: Some(0.75), ..signals(0.10, 0.10, 3, 0.0) };
        assert_eq!(judge(&busy_cpu, &c).0, Verdict::ScaleOut, "cpu alone");
        let some_cpu = Signals { cpu: Some(0.4), ..signals(0.10, 0.10, 3, 0.0) };
        assert_eq!(judge(&some_cpu, &c).0, Verdict::Steady, "cpu above low water");
        let narrow = ScalingConfig { scale_in_utilization: 0.45, scale_out_utilization: 0.5, ..c.clone() };
        assert_eq!(judge(&signals(0.40, 0.40, 3, 0.0), &narrow).0, Verdict::Steady, "one node fewer: 60 % >= 50 %");
        let unknown = Signals { cluster_utilization: None, max_node_utilization: None, live: 3, ..Default::default() };
        assert_eq!(judge(&unknown, &c).0, Verdict::Steady);
    }
}
