//! What the bench reads from or does to the machine: source addresses, node pids (for memory and
//! `--kill`), RSS from /proc, `/metrics` series, SIGKILL.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use super::BenchError;

/// `k` local source addresses 127.0.1.1, 127.0.1.2, … (each has its own ephemeral port range
/// towards a given server address), or none when `k` is 0 or a node is not on 127.0.0.0/8.
pub fn sources(k: u32, node_urls: &[String]) -> Vec<IpAddr> {
    let loopback = node_urls.iter().all(|u| {
        let host = ["ws://", "wss://", "http://", "https://"].iter().fold(u.as_str(), |h, p| h.trim_start_matches(p));
        let host = host.split(['/', '?']).next().unwrap_or("");
        let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
        host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
    });
    if !loopback {
        return Vec::new();
    }
    let base = u32::from(Ipv4Addr::new(127, 0, 1, 1));
    (0..k.min(1 << 20)).map(|j| IpAddr::V4(Ipv4Addr::from(base + j))).collect()
}

/// Node pids from `--pid-file` (lines `name pid`, as deploy/local-cluster.sh writes, or a bare pid,
/// which belongs to `bare_name`) and `--pid name=pid`.
pub fn pids(files: &[PathBuf], pairs: &[String], bare_name: Option<&str>) -> Result<BTreeMap<String, u32>, BenchError> {
    let mut m = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| BenchError::Config(format!("cannot read --pid-file {}: {e}", f.display())))?;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (name, pid) = match line.split_once(char::is_whitespace) {
                Some((n, p)) => (n.to_string(), p.trim()),
                None => match bare_name {
                    Some(n) => (n.to_string(), line),
                    None => {
                        return Err(BenchError::Usage(format!(
                            "{}: a bare pid needs --kill NAME (or write `name pid` lines)",
                            f.display()
                        )))
                    }
                },
            };
            let pid = pid.parse().map_err(|_| BenchError::Config(format!("{}: bad pid {pid:?}", f.display())))?;
            m.insert(name, pid);
        }
    }
    for p in pairs {
        let (name, pid) = p.split_once('=').ok_or_else(|| BenchError::Usage(format!("--pid {p:?}: want NAME=PID")))?;
        let pid = pid.parse().map_err(|_| BenchError::Usage(format!("--pid {p:?}: bad pid")))?;
        m.insert(name.to_string(), pid);
    }
    Ok(m)
}

/// VmRSS of a process in bytes (`None` if it is gone or unreadable).
pub fn rss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    vm_rss(&text)
}

/// The `VmRSS:  1234 kB` line of a /proc/<pid>/status text, in bytes.
pub fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The sum of the samples of `name` (any labels) in a Prometheus text exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let value = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// SIGKILL `pid` (through kill(1): the crate has no libc binding).
pub fn kill9(pid: u32) -> Result<(), BenchError> {
    let st = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .map_err(|e| BenchError::Runtime(format!("kill -KILL {pid}: {e}")))?;
    if st.success() {
        Ok(())
    } else {
        Err(BenchError::Runtime(format!("kill -KILL {pid} failed ({st})")))
    }
}

/// Whether process `pid` still runs: it has a /proc entry, is not a zombie (a killed child its
/// parent has not reaped yet is dead to us) and is not exiting. A killed process closes its
/// sockets while it exits, before it turns zombie: its devices see their connections drop while
/// it still looks alive by state alone, and a storm would start late by them.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| proc_state(&s))
        .is_some_and(|(state, flags)| !matches!(state, 'Z' | 'X' | 'x') && flags & PF_EXITING == 0)
}

/// The kernel's per-task flag set once `do_exit` starts (include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// The state letter and the flags of a /proc/<pid>/stat line (`pid (comm) S ppid pgrp session
/// tty tpgid flags ...`; comm may hold spaces and `)`).
pub fn proc_state(stat: &str) -> Option<(char, u64)> {
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let flags = fields.nth(5).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some((state, flags))
}

/// The soft open-files limit of this process (from /proc/self/limits).
pub fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_only_for_loopback_nodes() {
        let local = vec!["ws://127.0.0.1:8001".to_string(), "ws://127.0.0.1:8002/ws".to_string()];
        let s = sources(3, &local);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].to_string(), "127.0.1.1");
        assert_eq!(s[2].to_string(), "127.0.1.3");
        assert_eq!(sources(300, &local)[255].to_string(), "127.0.2.0");
        assert!(sources(3, &["ws://10.0.0.1:8001".to_string()]).is_empty());
        assert_eq!(sources(2, &["wss://127.0.0.1:8001".to_string()]).len(), 2);
        assert!(sources(0, &local).is_empty());
    }

    #[test]
    fn pid_files_and_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pids");
        std::fs::write(&f, "n1 100\nn2 200\n\n").unwrap();
        let bare = dir.path().join("bare");
        std::fs::write(&bare, "300\n").unwrap();
        let m = pids(&[f, bare.clone()], &["n2=201".to_string()], Some("n3")).unwrap();
        assert_eq!(m.into_iter().collect::<Vec<_>>(), vec![("n1".into(), 100), ("n2".into(), 201), ("n3".into(), 300)]);
        assert!(matches!(pids(&[bare], &[], None), Err(BenchError::Usage(_))));
        assert!(matches!(pids(&[], &["n1".to_string()], None), Err(BenchError::Usage(_))));
    }

    #[test]
    fn process_state_from_proc_stat() {
        assert_eq!(proc_state("42 (gateway) S 1 42 42 0 -1 4194560 170"), Some(('S', 4194560)));
        assert_eq!(proc_state("42 (a (b) c)) Z 1 42"), Some(('Z', 0)));
        assert_eq!(proc_state("42 (gateway) R 1 42 42 0 -1 4194564 170").map(|(_, f)| f & PF_EXITING), Some(4));
        assert_eq!(proc_state("garbage"), None);
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX), "no such pid");
    }

    #[test]
    fn parses_rss_and_metrics() {
        assert_eq!(vm_rss("Name:\tx\nVmRSS:\t   2048 kB\n"), Some(2048 * 1024));
        assert_eq!(vm_rss("Name:\tx\n"), None);
        let text = "# HELP gateway_connections x\ngateway_connections 12\ngateway_connections_total 5\n\
                    gateway_handshakes_total{result=\"ok\"} 3\ngateway_handshakes_total{result=\"no\"} 4\n";
        assert_eq!(metric(text, "gateway_connections"), Some(12.0));
        assert_eq!(metric(text, "gateway_handshakes_total"), Some(7.0));
        assert_eq!(metric(text, "gateway_process_resident_memory_bytes"), None);
    }
}
