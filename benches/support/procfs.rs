//! Process figures read from `/proc` for a process tree the bench does not hold as one child: a
//! server's postmaster and its children, and this process's reaped children.

use std::fs;

pub struct Stat {
    pub ppid: u32,
    /// utime + stime + cutime + cstime, in USER_HZ (100 Hz) ticks.
    pub cpu_ticks: u64,
}

/// Fields 4 and 14–17 of `/proc/<pid>/stat` (counted after the last `)`, as the name may hold one).
pub fn stat(pid: u32) -> Option<Stat> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    let n = |i: usize| f.get(i - 3)?.parse::<u64>().ok();
    Some(Stat { ppid: n(4)? as u32, cpu_ticks: n(14)? + n(15)? + n(16)? + n(17)? })
}

/// The live processes whose parent is `parent`.
pub fn children(parent: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| stat(p).is_some_and(|s| s.ppid == parent))
        .collect()
}

/// CPU time (µs) of this process's exited and reaped children so far (pgbench, psql).
pub fn child_cpu_us() -> u64 {
    let Some(s) = fs::read_to_string("/proc/self/stat").ok() else { return 0 };
    let Some(end) = s.rfind(')') else { return 0 };
    let f: Vec<&str> = s[end + 1..].split_whitespace().collect();
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (n(16) + n(17)) * 10_000
}
