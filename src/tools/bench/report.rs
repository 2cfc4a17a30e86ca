//! The bench report: one JSON object (`--json`) or a table. Missing figures are `null` / "n/a".

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::stats::{Latency, Window};

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `steady` or `storm`.
    pub scenario: String,
    /// Devices this process ran (`{prefix}-{first}` … `{prefix}-{first + devices - 1}`).
    pub devices: u32,
    pub prefix: String,
    pub first: u32,
    /// Distinct local source addresses used (0: the OS picks).
    pub sources: u32,
    /// Devices that had connected at least once by the end of the connect phase.
    pub connected: u32,
    /// Devices connected when the run ended (before shutdown).
    pub connected_at_end: u32,
    /// From start until every device had connected once; `null` if some never did.
    pub all_connected_ms: Option<u64>,
    /// `devices / all_connected_ms`, devices per second.
    pub connect_rate_per_s: Option<f64>,
    /// Dial attempts and successful handshakes over the whole run.
    pub attempts: u64,
    pub accepts: u64,
    /// Dialing → Connected of every attempt that succeeded.
    pub handshake: Latency,
    /// Every outcome over the whole run, by reason.
    pub outcomes: BTreeMap<String, u64>,
    /// Outcomes other than connects and redirects (refusals, unreachable, closes, stops), whole run.
    pub errors: u64,
    pub memory: Vec<NodeMemory>,
    pub storm: Option<StormReport>,
    pub elapsed_ms: u64,
}

/// Server memory of one node, when the bench can see it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeMemory {
    pub node: String,
    pub pid: Option<u32>,
    /// `proc` (/proc/<pid>/status VmRSS), `metrics` (gateway_process_resident_memory_bytes), or `n/a`.
    pub source: String,
    pub rss_before_bytes: Option<u64>,
    pub rss_after_bytes: Option<u64>,
    /// The node's live connections before and after (from /metrics `gateway_connections`, else status).
    pub connections_before: Option<u64>,
    pub connections_after: Option<u64>,
    /// (rss_after − rss_before) / (connections_after − connections_before).
    pub bytes_per_connection: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StormReport {
    /// `drain`, `kill`, or `exit` (--await-exit: killed by another process).
    pub event: String,
    pub node: String,
    /// Since bench start.
    pub trigger_ms: u64,
    /// Devices connected to `node` at the trigger.
    pub affected: u32,
    /// Affected devices connected again before the end.
    pub rehomed: u32,
    /// From the trigger until 50 / 99 / 100 % of the affected devices were connected again.
    pub t50_ms: Option<u64>,
    pub t99_ms: Option<u64>,
    pub t100_ms: Option<u64>,
    /// Every re-homed device's delay from the trigger in ms, sorted: several loaders' reports of
    /// one storm merge into its percentiles.
    pub delays_ms: Vec<u64>,
    /// Devices of this process not on `node` at the trigger, and how many of them did anything
    /// after it (closed, dialled, refused, connected): a storm should leave them alone.
    pub others: u32,
    pub others_disturbed: u32,
    /// Whether the run stopped at --timeout-secs rather than with every device connected.
    pub timed_out: bool,
    pub window_ms: u64,
    pub windows: Vec<Window>,
    /// Outcomes after the trigger, by reason.
    pub outcomes: BTreeMap<String, u64>,
    /// From the trigger until every survivor's ring (its status, polled every 50 ms) left the
    /// node out.
    pub ring_converged_ms: Option<u64>,
    /// The longest backoff wait a device chose after the trigger, and how many waits reached the
    /// backoff cap.
    pub max_wait_ms: u64,
    pub waits_at_cap: u64,
    /// What `gateway plan-storm` predicts for the same storm, when the cluster's admission is known.
    pub model: Option<ModelComparison>,
}

/// The project's own model of this storm next to the measurement.
#[derive(Debug, Clone, Serialize)]
pub struct ModelComparison {
    /// The `gateway plan-storm` command line that gives these figures.
    pub command: String,
    pub t50_ms: Option<u64>,
    pub t99_ms: Option<u64>,
    pub t100_ms: Option<u64>,
    /// Measured / predicted.
    pub ratio_t50: Option<f64>,
    pub ratio_t99: Option<f64>,
    pub ratio_t100: Option<f64>,
}

impl ModelComparison {
    /// Compares `measured` (t50, t99, t100) with the model's report.
    pub fn new(command: String, model: &crate::tools::plan::StormReport, measured: [Option<u64>; 3]) -> Self {
        let predicted = [model.p50_connected_ms, model.p99_connected_ms, model.all_connected_ms];
        let ratio = |k: usize| match (measured[k], predicted[k]) {
            (Some(m), Some(p)) if p > 0 => Some((m as f64 / p as f64 * 100.0).round() / 100.0),
            _ => None,
        };
        ModelComparison {
            command,
            t50_ms: predicted[0],
            t99_ms: predicted[1],
            t100_ms: predicted[2],
            ratio_t50: ratio(0),
            ratio_t99: ratio(1),
            ratio_t100: ratio(2),
        }
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v}{unit}"))
}

fn mib(b: Option<u64>) -> String {
    b.map_or("n/a".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
}

impl Report {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "bench {}: {} devices ({}-{} …), {} source addresses, {:.1} s",
            self.scenario,
            self.devices,
            self.prefix,
            self.first,
            self.sources,
            self.elapsed_ms as f64 / 1000.0
        );
        let _ = writeln!(s, "connected        {}/{} (at end {})", self.connected, self.devices, self.connected_at_end);
        let _ = writeln!(s, "all connected    {}", opt(self.all_connected_ms, " ms"));
        let _ =
            writeln!(s, "connect rate     {}", opt(self.connect_rate_per_s.map(|r| format!("{r:.0}")), " devices/s"));
        let _ = writeln!(s, "attempts         {}  accepts {}  errors {}", self.attempts, self.accepts, self.errors);
        let h = &self.handshake;
        let _ = writeln!(
            s,
            "handshake        p50 {}  p99 {}  p99.9 {}  max {}  (n={})",
            opt(h.p50_ms, " ms"),
            opt(h.p99_ms, " ms"),
            opt(h.p999_ms, " ms"),
            opt(h.max_ms, " ms"),
            h.count
        );
        let _ = writeln!(s, "\noutcomes (whole run)");
        for (k, v) in &self.outcomes {
            let _ = writeln!(s, "  {k:<32} {v:>8}");
        }
        if !self.memory.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<8} {:>8} {:<8} {:>11} {:>11} {:>8} {:>8} {:>12}",
                "NODE", "PID", "SOURCE", "RSS BEFORE", "RSS AFTER", "CONNS<", "CONNS>", "BYTES/CONN"
            );
            for m in &self.memory {
                let _ = writeln!(
                    s,
                    "{:<8} {:>8} {:<8} {:>11} {:>11} {:>8} {:>8} {:>12}",
                    m.node,
                    opt(m.pid, ""),
                    m.source,
                    mib(m.rss_before_bytes),
                    mib(m.rss_after_bytes),
                    opt(m.connections_before, ""),
                    opt(m.connections_after, ""),
                    opt(m.bytes_per_connection.map(|b| format!("{b:.0}")), "")
                );
            }
        }
        if let Some(st) = &self.storm {
            let _ = writeln!(
                s,
                "\nstorm: {} {} at {} ms; affected {}, re-homed {}{}",
                st.event,
                st.node,
                st.trigger_ms,
                st.affected,
                st.rehomed,
                if st.timed_out { " (timed out)" } else { "" }
            );
            let _ = writeln!(
                s,
                "re-homed 50% {}  99% {}  100% {}",
                opt(st.t50_ms, " ms"),
                opt(st.t99_ms, " ms"),
                opt(st.t100_ms, " ms")
            );
            let _ = writeln!(s, "other devices disturbed {} of {}", st.others_disturbed, st.others);
            let _ = writeln!(s, "every survivor's ring without {}: {}", st.node, opt(st.ring_converged_ms, " ms"));
            let _ = writeln!(s, "longest backoff wait {} ms; waits at the cap: {}", st.max_wait_ms, st.waits_at_cap);
            if let Some(m) = &st.model {
                let ratio = |r: Option<f64>| r.map_or("n/a".into(), |r| format!("{r:.2}x"));
                let _ = writeln!(
                    s,
                    "model ({}): 50% {}  99% {}  100% {}; measured/model {} / {} / {}",
                    m.command,
                    opt(m.t50_ms, " ms"),
                    opt(m.t99_ms, " ms"),
                    opt(m.t100_ms, " ms"),
                    ratio(m.ratio_t50),
                    ratio(m.ratio_t99),
                    ratio(m.ratio_t100)
                );
            }
            let _ = writeln!(s, "outcomes after the trigger");
            for (k, v) in &st.outcomes {
                let _ = writeln!(s, "  {k:<32} {v:>8}");
            }
            let _ = writeln!(s, "{:>8} {:>9} {:>8} {:>9}", "T+MS", "ATTEMPTS", "ACCEPTS", "FAILURES");
            for w in &st.windows {
                let _ = writeln!(s, "{:>8} {:>9} {:>8} {:>9}", w.t_ms, w.attempts, w.accepts, w.failures);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            scenario: "storm".into(),
            devices: 2,
            prefix: "dev".into(),
            first: 0,
            sources: 64,
            connected: 2,
            connected_at_end: 2,
            all_connected_ms: Some(100),
            connect_rate_per_s: Some(20.0),
            attempts: 5,
            accepts: 4,
            handshake: Latency {
                count: 4,
                p50_ms: Some(1.0),
                p99_ms: Some(2.0),
                p999_ms: Some(2.0),
                max_ms: Some(2.0),
            },
            outcomes: [("101 connected".to_string(), 4)].into(),
            errors: 0,
            memory: vec![NodeMemory {
                node: "n1".into(),
                pid: None,
                source: "n/a".into(),
                rss_before_bytes: None,
                rss_after_bytes: None,
                connections_before: Some(0),
                connections_after: Some(1),
                bytes_per_connection: None,
            }],
            storm: Some(StormReport {
                event: "drain".into(),
                node: "n1".into(),
                trigger_ms: 200,
                affected: 1,
                rehomed: 1,
                t50_ms: Some(30),
                t99_ms: Some(30),
                t100_ms: Some(30),
                delays_ms: vec![30],
                others: 1,
                others_disturbed: 0,
                timed_out: false,
                window_ms: 250,
                windows: vec![Window { t_ms: 0, attempts: 1, accepts: 1, failures: 0 }],
                outcomes: BTreeMap::new(),
                ring_converged_ms: Some(20),
                max_wait_ms: 800,
                waits_at_cap: 0,
                model: None,
            }),
            elapsed_ms: 300,
        }
    }

    #[test]
    fn json_shape_scripts_rely_on() {
        let v = serde_json::to_value(sample()).unwrap();
        for k in [
            "scenario",
            "devices",
            "connected",
            "all_connected_ms",
            "connect_rate_per_s",
            "attempts",
            "accepts",
            "handshake",
            "outcomes",
            "errors",
            "memory",
            "storm",
            "elapsed_ms",
        ] {
            assert!(v.get(k).is_some(), "missing {k}: {v}");
        }
        for k in ["p50_ms", "p99_ms", "p999_ms"] {
            assert!(v["handshake"][k].is_number(), "{k}: {v}");
        }
        assert!(v["memory"][0]["bytes_per_connection"].is_null(), "unknown memory is null, not invented");
        let st = &v["storm"];
        for k in [
            "affected",
            "rehomed",
            "t50_ms",
            "t99_ms",
            "t100_ms",
            "windows",
            "outcomes",
            "max_wait_ms",
            "model",
            "delays_ms",
            "others",
            "others_disturbed",
        ] {
            assert!(st.get(k).is_some(), "storm lacks {k}: {st}");
        }
        assert_eq!(st["windows"][0]["attempts"], 1);
        let table = sample().render();
        assert!(table.contains("n/a"), "{table}");
        assert!(table.contains("re-homed 50% 30 ms"), "{table}");
    }
}
