//! Process metrics read from `/proc/self` at each scrape (`gateway_process_*`): resident and
//! virtual memory, CPU time, threads, open and allowed file descriptors, start time; and the
//! context switches of all its threads, from `getrusage`. Reads only this process's own files; on
//! a system without `/proc` that part of the family is simply absent.

use std::fmt::Error as FmtError;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Linux reports CPU times in `/proc/<pid>/stat` in USER_HZ ticks, fixed at 100 by the ABI.
const USER_HZ: f64 = 100.0;

/// One reading of `/proc/self`.
#[derive(Debug, Default, PartialEq)]
pub struct Sample {
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    /// See [`context_switches`].
    pub context_switches: Option<(u64, u64)>,
}

impl Sample {
    /// Reads the current process's figures; missing files leave fields empty.
    pub fn read() -> Sample {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let boot = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let times = stat_times(&stat);
        Sample {
            resident_bytes: status_kib(&status, "VmRSS:").map(|k| k * 1024),
            virtual_bytes: status_kib(&status, "VmSize:").map(|k| k * 1024),
            threads: status_kib(&status, "Threads:"),
            cpu_seconds: times.map(|(user, system, _)| (user + system) as f64 / USER_HZ),
            start_time_seconds: times
                .zip(boot_time(&boot))
                .map(|((_, _, start), btime)| btime as f64 + start as f64 / USER_HZ),
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
            max_fds: max_open_files(&limits),
            context_switches: context_switches(),
        }
    }
}

/// Context switches of every thread of this process so far, ended threads included
/// (`getrusage(RUSAGE_SELF)`): (voluntary: a thread blocked or waited; involuntary: the scheduler
/// took its core). A thread hand-off costs a voluntary switch on each side, so their rate per
/// request is how the benches count hand-offs.
pub fn context_switches() -> Option<(u64, u64)> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage only writes one `rusage` through the pointer, which points at one.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: zeroed is a valid `rusage` (plain integers), and getrusage succeeded.
    let usage = unsafe { usage.assume_init() };
    Some((u64::try_from(usage.ru_nvcsw).ok()?, u64::try_from(usage.ru_nivcsw).ok()?))
}

/// This process's CPU time (user + system) in seconds, from `/proc/self/stat` alone: cheap
/// enough to read every second (the scaling hint's CPU signal).
pub fn cpu_seconds() -> Option<f64> {
    cpu_seconds_of("self")
}

/// The CPU time (user + system) in seconds of process `pid` (a number, or `self`), from
/// `/proc/<pid>/stat` (the benches read their nodes' with it).
pub fn cpu_seconds_of(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_times(&stat).map(|(user, system, _)| (user + system) as f64 / USER_HZ)
}

/// `Name:   123 kB` (or a bare count such as `Threads:`) from `/proc/<pid>/status`.
fn status_kib(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// `(utime, stime, starttime)` in ticks from `/proc/<pid>/stat`. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted from the last `)`.
fn stat_times(stat: &str) -> Option<(u64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field n is at index n - 3.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((field(14)?, field(15)?, field(22)?))
}

/// `btime <seconds since the epoch>` from `/proc/stat`.
fn boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// The soft limit on `Max open files` from `/proc/<pid>/limits`.
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// Registered once in the node's registry; reads `/proc` on every scrape.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), FmtError> {
        let s = Sample::read();
        let gauges: [(&str, &str, Option<u64>); 5] = [
            ("process_resident_memory_bytes", "Resident memory size in bytes", s.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", s.virtual_bytes),
            ("process_threads", "OS threads of the process", s.threads),
            ("process_open_fds", "Open file descriptors", s.open_fds),
            ("process_max_fds", "Soft limit on open file descriptors", s.max_fds),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v as i64);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        if let Some(v) = s.cpu_seconds {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time in seconds",
                None,
                c.metric_type(),
            )?)?;
        }
        if let Some((voluntary, involuntary)) = s.context_switches {
            let counters = [
                ("process_voluntary_context_switches", "Context switches of all threads: waits", voluntary),
                ("process_involuntary_context_switches", "Context switches of all threads: preemptions", involuntary),
            ];
            for (name, help, value) in counters {
                let c = ConstCounter::new(value);
                c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
            }
        }
        if let Some(v) = s.start_time_seconds {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let status = "Name:\tgateway\nVmSize:\t  123456 kB\nVmRSS:\t    2048 kB\nThreads:\t7\n";
        assert_eq!(status_kib(status, "VmRSS:"), Some(2048));
        assert_eq!(status_kib(status, "VmSize:"), Some(123456));
        assert_eq!(status_kib(status, "Threads:"), Some(7));
        assert_eq!(status_kib(status, "VmSwap:"), None);
        // A command name with a space and a parenthesis must not shift the fields.
        let stat = "42 (gw (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 12345 1000 500";
        assert_eq!(stat_times(stat), Some((250, 50, 12345)));
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            20000                20000                files\n";
        assert_eq!(max_open_files(limits), Some(20000));
    }

    #[test]
    fn reads_this_process() {
        let s = Sample::read();
        let rss = s.resident_bytes.expect("VmRSS on Linux");
        assert!(rss > 0 && rss <= s.virtual_bytes.expect("VmSize"), "{s:?}");
        assert!(s.open_fds.expect("fds") >= 3 && s.open_fds <= s.max_fds, "{s:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let start = s.start_time_seconds.expect("start time");
        assert!(start <= now + 1.0 && start > now - 86_400.0, "start {start}, now {now}");
    }

    #[test]
    fn counts_the_context_switches_of_threads_that_ended() {
        const WAITS: u64 = 20;
        let (before, _) = context_switches().expect("getrusage on Linux");
        // Each sleep blocks the thread: a voluntary switch, counted after the thread is gone.
        std::thread::spawn(|| (0..WAITS).for_each(|_| std::thread::sleep(std::time::Duration::from_millis(1))))
            .join()
            .unwrap();
        let (after, _) = context_switches().expect("getrusage on Linux");
        assert!(after >= before + WAITS, "voluntary switches {before} -> {after}");
    }
}
