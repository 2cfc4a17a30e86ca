//! The Raft log on disk: `log/` in the data dir, a run of segment files and a `meta` file.
//!
//! - **Segments** (`<seq>.seg`) hold records: an entry (`index → entry`) or a committed hint.
//!   Each record carries a checksum chained from the record before it (the first from the
//!   segment's random salt), so a record is read back only when every record before it in its
//!   segment was; a crash in the middle of a write leaves a prefix of the log. Files are zero-filled
//!   ahead of the writes, so an append overwrites allocated blocks and its `fdatasync` has no
//!   file size to record. Once a write would take a segment past [`SEGMENT_BYTES`], the writes go
//!   on in the next one.
//! - **`meta`** holds the vote and the last purged log id, replaced whole (a temp file, `fsync`,
//!   `rename`, `fsync` of the directory) before either is acknowledged.
//! - **Durability.** Every append is `fdatasync`ed before it returns. A truncation deletes later
//!   segments first, then marks the log's end durably (a zeroed record header) and goes on in a
//!   new segment, so nothing is ever written past a mark: what lies beyond one is never read
//!   again (a torn write found on open is cut the same way). A purge records the last purged id
//!   before it deletes whole segments (a purged entry still in a kept segment is never read).
//!
//! One `log.redb` of an older build is migrated on the first open (see [`super::log_redb`]).
//! Generic over the values it stores (the Raft adapter's entry, log id and vote types): this
//! module knows files, not openraft. Callers run it on one thread (the log writer).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::segment::{
    corrupt, create_segment, fsync_dir, meta_bytes, read_meta, record, replace_file, scan, segment_path, COMMITTED,
    ENTRY, RECORD_HEADER, SEGMENT_HEADER, ZERO_CHUNK,
};
use super::{log_redb, StoreError};
use crate::codec::{decode, encode};

/// The writes move to a new segment once one would take the current one past this.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// Most bytes one read of consecutive records takes (a range is read in such steps, so a read
/// holds its entries decoded and at most this much more).
const READ_BYTES: u64 = 8 << 20;

/// A log id's index (the store stores log ids as opaque values otherwise).
pub trait Indexed {
    fn index(&self) -> u64;
}

/// Handle on `log/`. Cheap to clone; every clone is the same log.
#[derive(Clone)]
pub struct LogDb {
    inner: Arc<Mutex<Inner>>,
}

struct Segment {
    seq: u64,
    file: File,
    /// The index of `entries[0]`.
    first: u64,
    /// `(record offset, payload length)` of each entry, indexes `first..`.
    entries: Vec<(u64, u32)>,
}

impl Segment {
    fn last(&self) -> Option<u64> {
        (!self.entries.is_empty()).then(|| self.first + self.entries.len() as u64 - 1)
    }
}

struct Inner {
    dir: PathBuf,
    segment_bytes: u64,
    /// Oldest first, never empty; the last one takes the writes.
    segments: Vec<Segment>,
    /// Where the next record goes in the last segment.
    end: u64,
    /// The check the next record chains from.
    prev: u64,
    /// How far the last segment's file is written (zero-filled past `end`).
    zeroed: u64,
    /// The vote's bytes.
    vote: Option<Vec<u8>>,
    /// The last purged index and the log id's bytes (an `Option<L>`).
    purged: Option<(u64, Vec<u8>)>,
    /// The last committed hint's bytes (an `Option<L>`).
    committed: Option<Vec<u8>>,
    /// Bytes the appends wrote since the open, zero fill included.
    written: u64,
}

impl Inner {
    fn last_segment(&mut self) -> &mut Segment {
        self.segments.last_mut().expect("a log has a segment")
    }

    /// The last entry's index, if one is not purged.
    fn last_live(&self) -> Option<u64> {
        let last = self.segments.iter().rev().find_map(Segment::last)?;
        (self.purged.as_ref().is_none_or(|(p, _)| last > *p)).then_some(last)
    }

    /// Starts the next segment; the writes go there.
    fn roll(&mut self) -> Result<(), StoreError> {
        let seq = self.segments.last().map_or(1, |s| s.seq + 1);
        let (file, salt) = create_segment(&self.dir, seq)?;
        self.segments.push(Segment { seq, file, first: 0, entries: Vec::new() });
        (self.end, self.prev, self.zeroed) = (SEGMENT_HEADER, salt, ZERO_CHUNK);
        Ok(())
    }

    /// Appends entries (consecutive, following the log's last one) and a committed hint, durably.
    fn append(&mut self, entries: &[(u64, Vec<u8>)], committed: Option<Vec<u8>>) -> Result<(), StoreError> {
        if let Some(&(first, _)) = entries.first() {
            if entries.windows(2).any(|w| w[1].0 != w[0].0 + 1) {
                return Err(corrupt(format!("a log append from index {first} is not consecutive")));
            }
            match self.last_live() {
                // Raft replaces a conflicting suffix; openraft truncates first, so this is a guard.
                Some(last) if first <= last => self.truncate(first)?,
                Some(last) if first > last + 1 => {
                    return Err(corrupt(format!("a log append at index {first} after the last entry {last}")));
                }
                _ => {}
            }
            // Each segment's entries run on: a log emptied by a purge goes on in a new one.
            if self.segments.last().and_then(Segment::last).is_some_and(|l| l + 1 != first) {
                self.roll()?;
            }
        }
        let size: u64 = entries.iter().map(|(_, e)| RECORD_HEADER + e.len() as u64).sum::<u64>()
            + committed.as_ref().map_or(0, |c| RECORD_HEADER + c.len() as u64);
        if size == 0 {
            return Ok(());
        }
        if self.end > SEGMENT_HEADER && self.end + size > self.segment_bytes {
            self.roll()?;
        }
        let mut buf = Vec::with_capacity(size as usize);
        let mut prev = self.prev;
        let mut placed = Vec::with_capacity(entries.len());
        for (index, e) in entries {
            placed.push((self.end + buf.len() as u64, e.len() as u32));
            prev = record(&mut buf, prev, ENTRY, *index, e)?;
        }
        if let Some(c) = &committed {
            prev = record(&mut buf, prev, COMMITTED, 0, c)?;
        }
        let stop = self.end + buf.len() as u64;
        let mut zeroed = self.zeroed;
        if stop > zeroed {
            // Past the zero fill: the write fills on to the next chunk's end.
            zeroed = stop.div_ceil(ZERO_CHUNK) * ZERO_CHUNK;
            // From the allocator, zeroed (see `segment::scan` on `Vec::resize`).
            buf.extend_from_slice(&vec![0u8; (zeroed - stop) as usize]);
        }
        let end = self.end;
        let seg = self.last_segment();
        seg.file.write_all_at(&buf, end)?;
        seg.file.sync_data()?;
        self.written += buf.len() as u64;
        let seg = self.last_segment();
        if seg.entries.is_empty() {
            seg.first = entries.first().map_or(0, |e| e.0);
        }
        seg.entries.extend(placed);
        (self.end, self.prev, self.zeroed) = (stop, prev, zeroed);
        if committed.is_some() {
            self.committed = committed;
        }
        Ok(())
    }

    /// Deletes the entries from index `from` on: marks the log's end before the first of them
    /// and goes on in a new segment.
    fn truncate(&mut self, from: u64) -> Result<(), StoreError> {
        let Some(k) = self.segments.iter().position(|s| s.last().is_some_and(|l| l >= from)) else {
            return Ok(());
        };
        // Later segments go first, so a crash in between leaves a prefix of the log.
        if k + 1 < self.segments.len() {
            for s in self.segments.drain(k + 1..) {
                fs::remove_file(segment_path(&self.dir, s.seq))?;
            }
            fsync_dir(&self.dir)?;
        }
        let dir = self.dir.clone();
        let seg = self.last_segment();
        let at = seg.entries[from.saturating_sub(seg.first) as usize].0;
        seg.file.write_all_at(&[0; RECORD_HEADER as usize], at)?;
        seg.file.sync_data()?;
        let s = scan(&seg.file, &segment_path(&dir, seg.seq), seg.seq)?;
        debug_assert_eq!(s.end, at, "the scan stops at the truncation's mark");
        (seg.first, seg.entries) = (s.first, s.entries);
        // Nothing is written after a mark: the records past it stay unread for good.
        self.roll()
    }

    /// Records `upto` (with its log id's bytes) as purged, then deletes whole segments of purged
    /// entries.
    fn purge(&mut self, upto: u64, log_id: Vec<u8>) -> Result<(), StoreError> {
        self.purged = Some((upto, log_id));
        self.write_meta()?;
        let n = self.segments.len();
        let gone = self.segments[..n - 1].iter().take_while(|s| s.last().is_none_or(|l| l <= upto)).count();
        if gone > 0 {
            for s in self.segments.drain(..gone) {
                fs::remove_file(segment_path(&self.dir, s.seq))?;
            }
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Replaces `meta` durably with the vote and the last purged id held.
    fn write_meta(&self) -> Result<(), StoreError> {
        let purged = self.purged.as_ref().map(|(i, b)| (*i, b.as_slice()));
        replace_file(&self.dir, "meta", &meta_bytes(self.vote.as_deref(), purged))
    }
}

/// Reads `log/` as it was left.
fn load(dir: &Path, segment_bytes: u64) -> Result<Inner, StoreError> {
    let (vote, purged) = read_meta(&dir.join("meta"))?;
    let mut seqs = Vec::new();
    for e in fs::read_dir(dir)? {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if let Some(seq) = name.strip_suffix(".seg").and_then(|s| s.parse::<u64>().ok()) {
            seqs.push(seq);
        } else if name.ends_with(".tmp") {
            // A segment or meta file a crash left half made: never part of the log.
            fs::remove_file(dir.join(&*name))?;
        }
    }
    seqs.sort_unstable();
    let mut inner = Inner {
        dir: dir.to_path_buf(),
        segment_bytes,
        segments: Vec::with_capacity(seqs.len()),
        end: 0,
        prev: 0,
        zeroed: 0,
        vote,
        purged,
        committed: None,
        written: 0,
    };
    let n = seqs.len();
    for (i, seq) in seqs.into_iter().enumerate() {
        let path = segment_path(dir, seq);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let s = scan(&file, &path, seq)?;
        // A closed segment was fully synced before the next one was written: its records end
        // cleanly, and the next one's entries follow them (or everything before is purged).
        if i + 1 < n && !s.clean {
            return Err(corrupt(format!("{}: a record in the middle of the log does not check", path.display())));
        }
        let before = inner.segments.iter().rev().find_map(Segment::last);
        if let (Some(last), false) = (before, s.entries.is_empty()) {
            let purged = inner.purged.as_ref().is_some_and(|(p, _)| last <= *p);
            if s.first != last + 1 && !purged {
                return Err(corrupt(format!("{}: starts at index {}, after index {last}", path.display(), s.first)));
            }
        }
        if s.committed.is_some() {
            inner.committed = s.committed;
        }
        (inner.end, inner.prev, inner.zeroed) = (s.end, s.prev, s.len);
        if !s.clean {
            // A torn write that was never acknowledged: mark the end where the log ends, and go
            // on in a new segment (as after a truncation).
            file.write_all_at(&[0; RECORD_HEADER as usize], s.end)?;
            file.sync_data()?;
            tracing::warn!(path = %path.display(), offset = s.end, "the Raft log ends in a torn write; cut there");
        }
        inner.segments.push(Segment { seq, file, first: s.first, entries: s.entries });
        if !s.clean {
            inner.roll()?;
        }
    }
    if inner.segments.is_empty() {
        return Err(corrupt(format!("{}: no log segment", dir.display())));
    }
    Ok(inner)
}

/// Creates `log/` in `dir`, with what a `log.redb` there held.
fn create<L: DeserializeOwned + Indexed>(dir: &Path) -> Result<(), StoreError> {
    let legacy_path = dir.join("log.redb");
    let legacy = match noted(dir)? {
        Some(true) => {
            return Err(corrupt(format!(
                "{}: missing, and log.redb says the Raft log moved there",
                dir.join("log").display()
            )));
        }
        Some(false) => Some(log_redb::read(&legacy_path)?),
        None => None,
    };
    let tmp = dir.join("log.tmp");
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    fs::create_dir(&tmp)?;
    let (file, salt) = create_segment(&tmp, 1)?;
    let mut inner = Inner {
        dir: tmp.clone(),
        segment_bytes: SEGMENT_BYTES,
        segments: vec![Segment { seq: 1, file, first: 0, entries: Vec::new() }],
        end: SEGMENT_HEADER,
        prev: salt,
        zeroed: ZERO_CHUNK,
        vote: None,
        purged: None,
        committed: None,
        written: 0,
    };
    if let Some(l) = &legacy {
        inner.vote = l.vote.clone();
        if let Some(b) = &l.last_purged {
            inner.purged = decode::<Option<L>>(b)?.map(|id| (id.index(), b.clone()));
        }
        for chunk in l.entries.chunks(1024) {
            inner.append(chunk, None)?;
        }
        inner.append(&[], l.committed.clone())?;
    }
    inner.write_meta()?;
    drop(inner);
    fs::rename(&tmp, dir.join("log"))?;
    fsync_dir(dir)?;
    // An older build would open (or create) log.redb and start on a log that went backwards.
    fence_older_builds(dir)?;
    if let Some(l) = legacy {
        tracing::info!(dir = %dir.display(), entries = l.entries.len(), "migrated the Raft log from log.redb to log/");
    }
    Ok(())
}

/// Makes `log.redb` the note an older build refuses, unless it already is. A migration that
/// stopped between renaming `log/` into place and writing the note left the old file there.
fn fence_older_builds(dir: &Path) -> Result<(), StoreError> {
    if noted(dir)? != Some(true) {
        replace_file(dir, "log.redb", log_redb::MOVED_NOTE)?;
    }
    Ok(())
}

/// Whether `dir/log.redb` is the note (reading only its first bytes); `None` when there is none.
fn noted(dir: &Path) -> Result<Option<bool>, StoreError> {
    let mut head = vec![0u8; log_redb::MOVED_NOTE.len()];
    match File::open(dir.join("log.redb")) {
        Ok(f) => Ok(Some(f.read_exact_at(&mut head, 0).is_ok() && head == log_redb::MOVED_NOTE)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl LogDb {
    /// Opens (or creates) `log/` in `dir`, migrating a `log.redb` found there.
    pub fn open<L: DeserializeOwned + Indexed>(dir: &Path) -> Result<LogDb, StoreError> {
        Self::open_sized::<L>(dir, SEGMENT_BYTES)
    }

    /// As [`LogDb::open`], with segments closed at `segment_bytes`.
    pub(crate) fn open_sized<L: DeserializeOwned + Indexed>(
        dir: &Path,
        segment_bytes: u64,
    ) -> Result<LogDb, StoreError> {
        let log = dir.join("log");
        if !log.exists() {
            create::<L>(dir).map_err(StoreError::opening(&log))?;
        }
        let inner = load(&log, segment_bytes).map_err(StoreError::opening(&log))?;
        fence_older_builds(dir).map_err(StoreError::opening(&dir.join("log.redb")))?;
        Ok(LogDb { inner: Arc::new(Mutex::new(inner)) })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last purged log id (see [`LogDb::purge`]).
    pub fn last_purged<L: DeserializeOwned>(&self) -> Result<Option<L>, StoreError> {
        let g = self.lock();
        Ok(g.purged.as_ref().map(|(_, b)| decode::<Option<L>>(b)).transpose()?.flatten())
    }

    /// The entry with the highest index, unless it is purged.
    pub fn last<E: DeserializeOwned>(&self) -> Result<Option<E>, StoreError> {
        let Some(last) = self.lock().last_live() else { return Ok(None) };
        Ok(self.entries(last..=last)?.pop())
    }

    /// The entries in `range` the log holds.
    pub fn entries<E: DeserializeOwned>(&self, range: impl RangeBounds<u64>) -> Result<Vec<E>, StoreError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e,
            Bound::Excluded(&0) => return Ok(Vec::new()),
            Bound::Excluded(&e) => e - 1,
            Bound::Unbounded => u64::MAX,
        };
        let g = self.lock();
        let start = start.max(g.purged.as_ref().map_or(0, |p| p.0 + 1));
        let mut out = Vec::new();
        for seg in &g.segments {
            let Some(last) = seg.last() else { continue };
            let (a, b) = (start.max(seg.first), end.min(last));
            if a > b {
                continue;
            }
            let mut run = &seg.entries[(a - seg.first) as usize..=(b - seg.first) as usize];
            while !run.is_empty() {
                // One read of consecutive records, up to READ_BYTES (or one larger record).
                let from = run[0].0;
                let take = 1 + run[1..]
                    .iter()
                    .take_while(|&&(at, n)| at + RECORD_HEADER + n as u64 - from <= READ_BYTES)
                    .count();
                let (to, n) = run[take - 1];
                let mut buf = vec![0u8; (to + RECORD_HEADER + n as u64 - from) as usize];
                seg.file.read_exact_at(&mut buf, from)?;
                for &(at, n) in &run[..take] {
                    let o = (at - from + RECORD_HEADER) as usize;
                    out.push(decode(&buf[o..o + n as usize])?);
                }
                run = &run[take..];
            }
        }
        Ok(out)
    }

    /// Appends `(index, entry)` pairs durably (one `fdatasync` for the whole call), and with them
    /// the committed log id hint, if one is given (see [`LogDb::read_committed`]).
    pub fn append<E: Serialize, L: Serialize>(
        &self,
        entries: &[(u64, E)],
        committed: Option<&Option<L>>,
    ) -> Result<(), StoreError> {
        let entries = entries.iter().map(|(i, e)| Ok((*i, encode(e)?))).collect::<Result<Vec<_>, StoreError>>()?;
        let committed = committed.map(encode).transpose()?;
        self.lock().append(&entries, committed)
    }

    /// Deletes entries with index >= `from` (a conflicting suffix).
    pub fn truncate(&self, from: u64) -> Result<(), StoreError> {
        self.lock().truncate(from)
    }

    /// Records `log_id` (index `upto`) as the last purged, then drops the entries up to it.
    pub fn purge<L: Serialize>(&self, upto: u64, log_id: &L) -> Result<(), StoreError> {
        let bytes = encode(&Some(log_id))?;
        self.lock().purge(upto, bytes)
    }

    pub fn save_vote<V: Serialize>(&self, vote: &V) -> Result<(), StoreError> {
        let mut g = self.lock();
        g.vote = Some(encode(vote)?);
        g.write_meta()
    }

    pub fn read_vote<V: DeserializeOwned>(&self) -> Result<Option<V>, StoreError> {
        Ok(self.lock().vote.as_deref().map(decode).transpose()?)
    }

    /// The committed log id of the last [`LogDb::append`] that carried one and is still in the
    /// log: a hint for replay at start-up (an older one, or none, only means more replay).
    pub fn read_committed<L: DeserializeOwned>(&self) -> Result<Option<L>, StoreError> {
        Ok(self.lock().committed.as_deref().map(decode::<Option<L>>).transpose()?.flatten())
    }
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
