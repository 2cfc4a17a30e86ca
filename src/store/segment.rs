//! The Raft log's file formats (see [`super::log`]): a segment's header and records, each
//! checksummed in a chain from the one before, a segment's scan from its start, and the `meta`
//! file, replaced whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::StoreError;

/// A segment is zero-filled this far ahead of its writes at a time.
pub(super) const ZERO_CHUNK: u64 = 1 << 20;
const SEGMENT_MAGIC: &[u8; 8] = b"gwlogseg";
const META_MAGIC: &[u8; 8] = b"gwlogmet";
const FORMAT: u32 = 1;
/// Segment header: magic, format (u32), 4 unused bytes, seq (u64), salt (u64).
pub(super) const SEGMENT_HEADER: u64 = 32;
/// Record header: check (u64), payload length (u32), kind (u8), 3 unused bytes, index (u64).
pub(super) const RECORD_HEADER: u64 = 24;
pub(super) const ENTRY: u8 = 1;
pub(super) const COMMITTED: u8 = 2;

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.seg"))
}

pub(super) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

pub(super) fn corrupt(what: String) -> StoreError {
    StoreError::Corrupt(what)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Appends one record to `buf`, chained from `prev`; answers its check.
pub(super) fn record(buf: &mut Vec<u8>, prev: u64, kind: u8, index: u64, payload: &[u8]) -> Result<u64, StoreError> {
    let len = u32::try_from(payload.len()).map_err(|_| corrupt(format!("a log record of {} bytes", payload.len())))?;
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&[kind, 0, 0, 0]);
    buf.extend_from_slice(&index.to_le_bytes());
    buf.extend_from_slice(payload);
    let check = xxh3_64_with_seed(&buf[start + 8..], prev);
    buf[start..start + 8].copy_from_slice(&check.to_le_bytes());
    Ok(check)
}

/// Creates segment `seq` in `dir`, durably; answers the file and its salt. It is written and
/// synced under a temp name first, so a crash never leaves a segment without its header.
pub(super) fn create_segment(dir: &Path, seq: u64) -> Result<(File, u64), StoreError> {
    let salt: u64 = rand::random();
    let path = segment_path(dir, seq);
    let tmp = path.with_extension("seg.tmp");
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&tmp)?;
    let mut head = vec![0u8; ZERO_CHUNK as usize];
    head[..8].copy_from_slice(SEGMENT_MAGIC);
    head[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    head[16..24].copy_from_slice(&seq.to_le_bytes());
    head[24..32].copy_from_slice(&salt.to_le_bytes());
    file.write_all_at(&head, 0)?;
    file.sync_all()?;
    fs::rename(&tmp, &path)?;
    fsync_dir(dir)?;
    Ok((file, salt))
}

/// What one segment holds, read from its start.
pub(super) struct Scan {
    pub(super) first: u64,
    pub(super) entries: Vec<(u64, u32)>,
    pub(super) committed: Option<Vec<u8>>,
    /// Where its records end, and the check of the last one.
    pub(super) end: u64,
    pub(super) prev: u64,
    /// Whether they end in zeros or at the file's end (not in a torn or foreign record).
    pub(super) clean: bool,
    pub(super) len: u64,
}

pub(super) fn scan(file: &File, path: &Path, seq: u64) -> Result<Scan, StoreError> {
    let len = file.metadata()?.len();
    let mut head = [0u8; SEGMENT_HEADER as usize];
    if len < SEGMENT_HEADER {
        return Err(corrupt(format!("{}: shorter than a segment header", path.display())));
    }
    file.read_exact_at(&mut head, 0)?;
    if &head[..8] != SEGMENT_MAGIC {
        return Err(corrupt(format!("{}: not a log segment", path.display())));
    }
    if u32_at(&head, 8) != FORMAT {
        let f = u32_at(&head, 8);
        return Err(StoreError::Incompatible(format!(
            "{}: log segment format {f}, this build reads {FORMAT}",
            path.display()
        )));
    }
    if u64_at(&head, 16) != seq {
        return Err(corrupt(format!("{}: holds segment {}", path.display(), u64_at(&head, 16))));
    }
    let mut s = Scan {
        first: 0,
        entries: Vec::new(),
        committed: None,
        end: SEGMENT_HEADER,
        prev: u64_at(&head, 24),
        clean: true,
        len,
    };
    // Buffers come zeroed from the allocator (`vec![0; n]`): filling one byte by byte
    // (`Vec::resize`) is this crate's code, unoptimised in a debug build, and records reach a MiB.
    let mut head = [0u8; RECORD_HEADER as usize];
    loop {
        let at = s.end;
        if at + RECORD_HEADER > len {
            // Less than a header left: the zero fill's last bytes, or a torn header.
            let mut rest = vec![0u8; (len - at) as usize];
            file.read_exact_at(&mut rest, at)?;
            s.clean = rest.iter().all(|&b| b == 0);
            break;
        }
        file.read_exact_at(&mut head, at)?;
        if head.iter().all(|&b| b == 0) {
            break;
        }
        let (check, n, kind, index) = (u64_at(&head, 0), u32_at(&head, 8) as u64, head[12], u64_at(&head, 16));
        let follows = s.entries.is_empty() || index == s.first + s.entries.len() as u64;
        if at + RECORD_HEADER + n > len || !matches!(kind, ENTRY | COMMITTED) || (kind == ENTRY && !follows) {
            s.clean = false;
            break;
        }
        let mut rec = vec![0u8; (RECORD_HEADER + n) as usize];
        rec[..RECORD_HEADER as usize].copy_from_slice(&head);
        file.read_exact_at(&mut rec[RECORD_HEADER as usize..], at + RECORD_HEADER)?;
        if xxh3_64_with_seed(&rec[8..], s.prev) != check {
            s.clean = false;
            break;
        }
        if kind == ENTRY {
            if s.entries.is_empty() {
                s.first = index;
            }
            s.entries.push((at, n as u32));
        } else {
            s.committed = Some(rec[RECORD_HEADER as usize..].to_vec());
        }
        s.prev = check;
        s.end = at + RECORD_HEADER + n;
    }
    Ok(s)
}

/// `meta`'s vote and last purged (index, bytes).
pub(super) type Meta = (Option<Vec<u8>>, Option<(u64, Vec<u8>)>);

pub(super) fn read_meta(path: &Path) -> Result<Meta, StoreError> {
    let buf = fs::read(path)?;
    let bad = || corrupt(format!("{}: not a log meta file, or torn", path.display()));
    if buf.len() < 8 + 4 + 8 || &buf[..8] != META_MAGIC {
        return Err(bad());
    }
    let (body, check) = buf.split_at(buf.len() - 8);
    if xxh3_64(body) != u64_at(check, 0) {
        return Err(bad());
    }
    if u32_at(body, 8) != FORMAT {
        let f = u32_at(body, 8);
        return Err(StoreError::Incompatible(format!(
            "{}: log meta format {f}, this build reads {FORMAT}",
            path.display()
        )));
    }
    let mut at = 12;
    let field = |at: &mut usize| -> Result<Option<Vec<u8>>, StoreError> {
        let present = *body.get(*at).ok_or_else(bad)? == 1;
        let n = u32::from_le_bytes(body.get(*at + 1..*at + 5).ok_or_else(bad)?.try_into().expect("4 bytes")) as usize;
        let v = body.get(*at + 5..*at + 5 + n).ok_or_else(bad)?.to_vec();
        *at += 5 + n;
        Ok(present.then_some(v))
    };
    let vote = field(&mut at)?;
    let index = u64::from_le_bytes(body.get(at..at + 8).ok_or_else(bad)?.try_into().expect("8 bytes"));
    at += 8;
    let purged = field(&mut at)?.map(|b| (index, b));
    Ok((vote, purged))
}

/// `meta`'s bytes: the vote and the last purged (index, bytes), with a check over them.
pub(super) fn meta_bytes(vote: Option<&[u8]>, purged: Option<(u64, &[u8])>) -> Vec<u8> {
    let mut buf = META_MAGIC.to_vec();
    buf.extend_from_slice(&FORMAT.to_le_bytes());
    let field = |buf: &mut Vec<u8>, v: Option<&[u8]>| {
        buf.push(v.is_some() as u8);
        let v = v.unwrap_or_default();
        buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
        buf.extend_from_slice(v);
    };
    field(&mut buf, vote);
    buf.extend_from_slice(&purged.map_or(0, |p| p.0).to_le_bytes());
    field(&mut buf, purged.map(|p| p.1));
    buf.extend_from_slice(&xxh3_64(&buf).to_le_bytes());
    buf
}

/// Replaces `dir/name` with `bytes` durably: a temp file, `fsync`, `rename`, `fsync` of `dir`.
pub(super) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    fsync_dir(dir)?;
    Ok(())
}
