//! What the data directory's filesystem adds to a Raft log flush, checked once at start. On ext4
//! without a journal an `fdatasync` also writes the file's inode whenever its modification time
//! moved since the last one (every write moves it once per clock tick): one more disk round trip
//! on about half of a node's flushes under load (README, "A log flush on a filesystem without a
//! journal"). A journaled ext4 or XFS does not. Only a warning: the node runs either way, and
//! nothing is said when `/proc` or `/sys` cannot be read.

use std::path::Path;

/// The block device (its kernel name, e.g. `vda`) of the ext4 filesystem without a journal that
/// holds `dir`, or None: another filesystem, one with a journal, or not known.
pub fn journalless_ext4(dir: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mount_of(&mountinfo, &dir)?;
    if mount.fstype != "ext4" {
        return None;
    }
    // `/sys/dev/block/<major:minor>` links to the device's directory, named as the kernel names it.
    let link = std::fs::read_link(format!("/sys/dev/block/{}", mount.device)).ok()?;
    let name = link.file_name()?.to_str()?.to_string();
    // ext4 says itself: `journal_task` holds its journal thread's pid, or `<none>`. It is right for
    // a journal on another device too, which jbd2 lists under that device's name.
    if let Ok(task) = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task")) {
        return no_journal_task(&task).then_some(name);
    }
    // A kernel without that file: jbd2 lists each loaded journal as `<device>-<journal inode>`.
    let journals: Vec<String> =
        std::fs::read_dir("/proc/fs/jbd2").ok()?.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    (!has_journal(&journals, &name)).then_some(name)
}

/// Whether ext4's `journal_task` text says the filesystem has no journal (anything unexpected:
/// it may have one, so nothing is said).
fn no_journal_task(text: &str) -> bool {
    text.trim() == "<none>"
}

fn has_journal(journals: &[String], device: &str) -> bool {
    journals.iter().any(|j| j.strip_prefix(device).is_some_and(|rest| rest.starts_with('-')))
}

#[derive(Debug, PartialEq)]
struct Mount {
    /// `major:minor`.
    device: String,
    fstype: String,
}

/// The mount in `/proc/self/mountinfo` text whose mount point is the longest prefix of `path` (an
/// absolute, canonical path); the last one listed wins a tie (it is mounted over the others).
fn mount_of(mountinfo: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<(usize, Mount)> = None;
    for line in mountinfo.lines() {
        // `id parent major:minor root mount-point options [optional fields...] - fstype source super-options`
        let Some((head, tail)) = line.split_once(" - ") else { continue };
        let fields: Vec<&str> = head.split(' ').collect();
        let (Some(device), Some(point), Some(fstype)) = (fields.get(2), fields.get(4), tail.split(' ').next()) else {
            continue;
        };
        let point = unescape(point);
        if !path.starts_with(&point) {
            continue;
        }
        let depth = Path::new(&point).components().count();
        if best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, Mount { device: device.to_string(), fstype: fstype.to_string() }));
        }
    }
    best.map(|(_, m)| m)
}

/// A mount point as the kernel writes it: space, tab, newline and backslash as `\ooo` octal.
fn unescape(s: &str) -> String {
    let (mut out, bytes, mut i) = (Vec::with_capacity(s.len()), s.as_bytes(), 0);
    while i < bytes.len() {
        let octal =
            bytes.get(i + 1..i + 4).filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
23 22 0:21 / /proc rw,nosuid - proc proc rw
30 22 252:16 / /var/lib/gate\\040way rw,relatime shared:5 - xfs /dev/vdb rw
31 30 0:40 / /var/lib/gate\\040way/tmp rw - tmpfs tmpfs rw
32 22 252:32 / /srv rw - ext4 /dev/vdc rw
33 32 252:48 / /srv rw - ext4 /dev/vdd rw
";

    fn of(path: &str) -> Option<Mount> {
        mount_of(MOUNTINFO, Path::new(path))
    }

    #[test]
    fn the_data_directory_is_on_the_deepest_mount_that_holds_it() {
        let m = |device: &str, fstype: &str| Some(Mount { device: device.into(), fstype: fstype.into() });
        assert_eq!(of("/var/lib/gateway/data"), m("252:0", "ext4"), "a prefix of the name is not a parent");
        assert_eq!(of("/var/lib/gate way/data"), m("252:16", "xfs"), "an escaped space in the mount point");
        assert_eq!(of("/var/lib/gate way/tmp/x"), m("0:40", "tmpfs"));
        assert_eq!(of("/srv/data"), m("252:48", "ext4"), "the last of two mounts on one point");
        assert_eq!(of("/"), m("252:0", "ext4"));
        assert_eq!(mount_of("garbage\n\n1 2 3\n", Path::new("/x")), None);
    }

    #[test]
    fn a_journal_is_named_after_its_device() {
        let journals = vec!["vda-8".to_string(), "dm-1-8".to_string()];
        assert!(has_journal(&journals, "vda"));
        assert!(has_journal(&journals, "dm-1"));
        assert!(!has_journal(&journals, "vd"), "a prefix of another device's name");
        assert!(!has_journal(&journals, "dm-10"));
        assert!(!has_journal(&[], "vda"));
    }

    #[test]
    fn ext4_says_no_journal_only_with_none() {
        assert!(no_journal_task("<none>\n"));
        assert!(!no_journal_task("412\n"), "the journal thread's pid");
        assert!(!no_journal_task(""));
        assert!(!no_journal_task("none"));
    }

    #[test]
    fn octal_escapes_are_read_and_anything_else_is_kept() {
        assert_eq!(unescape("/a\\040b\\011c\\134d"), "/a b\tc\\d");
        assert_eq!(unescape("/a\\04"), "/a\\04");
        assert_eq!(unescape("/a\\9999"), "/a\\9999");
    }
}
