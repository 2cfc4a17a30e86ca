//! The data directory's filesystem, read at each scrape (`gateway_data_dir_size_bytes`,
//! `gateway_data_dir_available_bytes`): a node whose store cannot write stops and exits 1
//! (`cluster::Handle::fatal`), so an operator alerts on the room left before that. From
//! `statvfs(3)`; absent when it fails.

use std::ffi::CString;
use std::fmt::Error as FmtError;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// The filesystem that holds `dir`: (its size, the bytes still available to an unprivileged
/// writer), or None when it cannot be read.
pub fn space(dir: &Path) -> Option<(u64, u64)> {
    let path = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a NUL-terminated string, and statvfs writes one `statvfs` through the
    // pointer, which points at one; it is read only after a success.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded, so it filled the struct (and it started zeroed).
    let st = unsafe { st.assume_init() };
    let unit = st.f_frsize;
    Some((st.f_blocks * unit, st.f_bavail * unit))
}

/// The data directory's room, as gauges.
#[derive(Debug)]
pub struct DataDir(pub PathBuf);

impl Collector for DataDir {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), FmtError> {
        let Some((size, available)) = space(&self.0) else { return Ok(()) };
        let gauges = [
            ("data_dir_size_bytes", "Size of the filesystem holding the data directory", size),
            (
                "data_dir_available_bytes",
                "Bytes the node can still write on the data directory's filesystem",
                available,
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_has_a_size_and_room_within_it() {
        let dir = tempfile::tempdir().unwrap();
        let (size, available) = space(dir.path()).expect("statvfs of a temp dir");
        assert!(size > 0 && available <= size, "size {size}, available {available}");
        assert_eq!(space(&dir.path().join("missing")), None, "a path that does not exist");
    }
}
