//! The device side's threads run at a lower scheduling priority than the cluster side's (see
//! `DeviceConfig::device_nice`). Linux keeps a nice value per thread and a new thread inherits
//! its creator's, so the device runtime lowers each of its threads as it starts, and the cluster
//! runtime, the log writer and their blocking pools are created from threads still at the
//! process's own priority. Raising a priority back needs privileges, which a node does not ask for.

use std::sync::Once;

/// Lowers the calling thread's priority by `nice` (0: leaves it). A refusal is logged once per
/// process: the node then runs with every thread at one priority, as with 0.
pub fn lower_this_thread(nice: i32) {
    if nice == 0 {
        return;
    }
    if let Err(e) = set_nice(nice) {
        static WARNED: Once = Once::new();
        WARNED.call_once(
            || tracing::warn!(nice, error = %e, "could not lower the device threads' priority: all threads run at one"),
        );
    }
}

#[cfg(target_os = "linux")]
fn set_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: plain syscalls on the calling thread (PRIO_PROCESS with a thread id names that thread
    // on Linux); no memory is shared with them.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, libc::gettid() as libc::id_t, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_nice(_nice: i32) -> std::io::Result<()> {
    Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "per-thread priorities are Linux only"))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The calling thread's nice value, as the kernel reports it (`/proc/thread-self/stat`).
    fn this_thread_nice() -> Option<i32> {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
        // The command name (field 2) may hold spaces: count from the closing parenthesis.
        stat.rsplit_once(')')?.1.split_whitespace().nth(16)?.parse().ok()
    }

    #[test]
    fn a_lowered_thread_runs_at_the_new_nice_and_its_siblings_do_not() {
        let before = this_thread_nice().expect("this thread's nice");
        let lowered = std::thread::spawn(move || {
            lower_this_thread(5);
            this_thread_nice()
        })
        .join()
        .expect("thread");
        assert_eq!(lowered, Some((before + 5).min(19)));
        assert_eq!(this_thread_nice(), Some(before), "only the thread that asked is lowered");
    }
}
