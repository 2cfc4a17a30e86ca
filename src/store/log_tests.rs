//! The segment log's own tests: what a reopen reads back after appends, rolls, truncations,
//! purges, torn writes and corruption, and the migration of a `log.redb`. (openraft's storage
//! suite runs over it in `raft::suite_test`.)

use std::path::Path;

use super::*;

impl Indexed for u64 {
    fn index(&self) -> u64 {
        *self
    }
}

/// Small segments, so a few entries span several.
const SMALL: u64 = 512;

fn open(dir: &Path) -> LogDb {
    LogDb::open_sized::<u64>(dir, SMALL).expect("open the log")
}

fn entry(i: u64) -> String {
    format!("entry {i} {}", "x".repeat((i % 7) as usize * 10))
}

fn append(db: &LogDb, range: std::ops::RangeInclusive<u64>, committed: Option<u64>) {
    let entries: Vec<(u64, String)> = range.map(|i| (i, entry(i))).collect();
    db.append(&entries, committed.map(Some).as_ref()).expect("append");
}

fn all(db: &LogDb) -> Vec<String> {
    db.entries::<String>(..).expect("read")
}

fn expect(range: std::ops::RangeInclusive<u64>) -> Vec<String> {
    range.map(entry).collect()
}

fn segment_files(dir: &Path) -> Vec<u64> {
    let mut seqs: Vec<u64> = fs::read_dir(dir.join("log"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().to_string_lossy().strip_suffix(".seg")?.parse().ok())
        .collect();
    seqs.sort();
    seqs
}

#[test]
fn appends_votes_and_hints_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    assert_eq!((all(&db), db.read_vote::<u64>().unwrap(), db.last::<String>().unwrap()), (vec![], None, None));
    append(&db, 1..=3, Some(1));
    append(&db, 4..=4, None);
    db.save_vote(&7u64).unwrap();
    drop(db);
    let db = open(dir.path());
    assert_eq!(all(&db), expect(1..=4));
    assert_eq!(db.entries::<String>(2..4).unwrap(), expect(2..=3));
    assert_eq!(db.last::<String>().unwrap(), Some(entry(4)));
    assert_eq!(db.read_vote::<u64>().unwrap(), Some(7));
    assert_eq!(db.read_committed::<u64>().unwrap(), Some(1), "the last hint written");
}

#[test]
fn rolls_segments_and_reads_across_them() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for i in 1..=40 {
        append(&db, i..=i, Some(i - 1));
    }
    assert!(segment_files(dir.path()).len() > 4, "{:?}", segment_files(dir.path()));
    assert_eq!(all(&db), expect(1..=40));
    drop(db);
    let db = open(dir.path());
    assert_eq!(all(&db), expect(1..=40));
    assert_eq!(db.entries::<String>(9..=31).unwrap(), expect(9..=31));
    assert_eq!(db.read_committed::<u64>().unwrap(), Some(39));
    append(&db, 41..=42, None);
    assert_eq!(db.entries::<String>(40..).unwrap(), expect(40..=42));
}

#[test]
fn truncation_is_durable_and_old_records_never_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for i in 1..=30 {
        append(&db, i..=i, None);
    }
    let before = segment_files(dir.path());
    db.truncate(8).unwrap();
    assert!(segment_files(dir.path()).len() < before.len(), "later segments deleted");
    assert_eq!(all(&db), expect(1..=7));
    drop(db);
    // Entries 8.. are still on disk past the mark; a reopen does not read them.
    let db = open(dir.path());
    assert_eq!(all(&db), expect(1..=7));
    // A new entry 8 goes on in a new segment; the old 9.. behind the mark are never read.
    db.append(&[(8, "new 8".to_string())], None::<&Option<u64>>).unwrap();
    drop(db);
    let db = open(dir.path());
    let mut want = expect(1..=7);
    want.push("new 8".into());
    assert_eq!(all(&db), want);
    // An append over existing entries replaces them and what follows.
    db.append(&[(5, "new 5".to_string())], None::<&Option<u64>>).unwrap();
    assert_eq!(all(&db).len(), 5);
    // Whole log, then the same entries again: what lay past the mark stays gone.
    db.truncate(0).unwrap();
    assert_eq!(all(&db), Vec::<String>::new());
    append(&db, 1..=2, None);
    drop(db);
    assert_eq!(all(&open(dir.path())), expect(1..=2));
}

#[test]
fn purge_hides_entries_and_deletes_whole_segments() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for i in 1..=30 {
        append(&db, i..=i, None);
    }
    let before = segment_files(dir.path());
    db.purge(20, &20u64).unwrap();
    let after = segment_files(dir.path());
    assert!(after.len() < before.len() && after.last() == before.last(), "{before:?} -> {after:?}");
    assert_eq!(all(&db), expect(21..=30));
    assert_eq!(db.entries::<String>(15..=22).unwrap(), expect(21..=22));
    drop(db);
    let db = open(dir.path());
    assert_eq!((all(&db), db.last_purged::<u64>().unwrap()), (expect(21..=30), Some(20)));
    // Everything purged: the log is empty, the last segment stays.
    db.purge(30, &30u64).unwrap();
    assert_eq!((all(&db), db.last::<String>().unwrap()), (vec![], None));
    assert_eq!(segment_files(dir.path()).len(), 1);
}

/// A snapshot ahead of the log: openraft purges past the last entry, then appends after the
/// snapshot's index.
#[test]
fn purge_past_the_last_entry_then_append_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    append(&db, 1..=3, None);
    db.purge(100, &100u64).unwrap();
    assert_eq!(db.last::<String>().unwrap(), None);
    append(&db, 101..=103, Some(101));
    assert_eq!(all(&db), expect(101..=103));
    drop(db);
    let db = open(dir.path());
    assert_eq!((all(&db), db.last_purged::<u64>().unwrap()), (expect(101..=103), Some(100)));
    assert!(db.append(&[(200, "gap".to_string())], None::<&Option<u64>>).is_err(), "a gap is refused");
    assert_eq!(all(&db), expect(101..=103));
}

/// The file of the last segment, and where its records end.
fn tail(db: &LogDb) -> (PathBuf, u64) {
    let g = db.lock();
    let seq = g.segments.last().unwrap().seq;
    (segment_path(&g.dir, seq), g.end)
}

#[test]
fn a_torn_write_leaves_a_prefix_and_the_log_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    append(&db, 1..=2, None);
    let (path, _) = tail(&db);
    // Entry 3 written in full, then a torn entry 4: its header and half its payload.
    append(&db, 3..=3, None);
    let (_, end) = tail(&db);
    append(&db, 4..=4, None);
    drop(db);
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0xAB; 4], end + RECORD_HEADER + 2).unwrap();
    let db = open(dir.path());
    assert_eq!(all(&db), expect(1..=3));
    append(&db, 4..=5, None);
    drop(db);
    assert_eq!(all(&open(dir.path())), expect(1..=5));
}

#[test]
fn a_corrupt_record_in_a_closed_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for i in 1..=20 {
        append(&db, i..=i, None);
    }
    let first = segment_path(&dir.path().join("log"), segment_files(dir.path())[0]);
    drop(db);
    let f = OpenOptions::new().write(true).open(&first).unwrap();
    f.write_all_at(b"rot", SEGMENT_HEADER + RECORD_HEADER + 1).unwrap();
    let err = LogDb::open_sized::<u64>(dir.path(), SMALL).err().expect("refused");
    assert!(err.to_string().contains("does not check"), "{err}");
}

#[test]
fn a_torn_meta_file_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    db.save_vote(&3u64).unwrap();
    drop(db);
    let meta = dir.path().join("log/meta");
    let mut b = fs::read(&meta).unwrap();
    b.truncate(b.len() - 3);
    fs::write(&meta, b).unwrap();
    let err = LogDb::open_sized::<u64>(dir.path(), SMALL).err().expect("refused");
    assert!(err.to_string().contains("torn"), "{err}");
}

#[test]
fn migrates_a_log_redb_and_fences_older_builds() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = log_redb::Legacy {
        vote: Some(encode(&9u64).unwrap()),
        last_purged: Some(encode(&Some(4u64)).unwrap()),
        committed: Some(encode(&Some(6u64)).unwrap()),
        entries: (5..=8).map(|i| (i, encode(&entry(i)).unwrap())).collect(),
    };
    log_redb::write(&dir.path().join("log.redb"), &legacy).unwrap();
    let db = open(dir.path());
    assert_eq!(all(&db), expect(5..=8));
    assert_eq!(db.read_vote::<u64>().unwrap(), Some(9));
    assert_eq!(db.last_purged::<u64>().unwrap(), Some(4));
    assert_eq!(db.read_committed::<u64>().unwrap(), Some(6));
    append(&db, 9..=9, None);
    drop(db);
    // log.redb is now a note no redb opens.
    assert!(fs::read(dir.path().join("log.redb")).unwrap().starts_with(log_redb::MOVED_NOTE));
    assert!(redb::Database::open(dir.path().join("log.redb")).is_err());
    let db = open(dir.path());
    assert_eq!((all(&db), db.read_vote::<u64>().unwrap()), (expect(5..=9), Some(9)));
    drop(db);
    // A data dir that lost log/ is refused rather than started on an empty log.
    fs::remove_dir_all(dir.path().join("log")).unwrap();
    let err = LogDb::open_sized::<u64>(dir.path(), SMALL).err().expect("refused");
    assert!(err.to_string().contains("moved"), "{err}");
}

#[test]
fn a_fresh_log_fences_older_builds_too() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    assert!(redb::Database::open(dir.path().join("log.redb")).is_err());
    assert!(!dir.path().join("log.tmp").exists());
}

/// A closed segment's zero fill may end less than a record header after its last record.
#[test]
fn a_closed_segment_ending_in_a_few_zero_bytes_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    for i in 1..=20 {
        append(&db, i..=i, None);
    }
    drop(db);
    let first = segment_path(&dir.path().join("log"), segment_files(dir.path())[0]);
    let f = OpenOptions::new().read(true).write(true).open(&first).unwrap();
    let end = scan(&f, &first, segment_files(dir.path())[0]).unwrap().end;
    f.set_len(end + RECORD_HEADER / 2).unwrap();
    assert_eq!(all(&open(dir.path())), expect(1..=20));
}

/// An append writes its records, and the zero fill only when it passes the fill's end.
#[test]
fn an_append_writes_its_records_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let db = LogDb::open_sized::<u64>(dir.path(), SEGMENT_BYTES).unwrap();
    let mut records = 0;
    for i in 1..=200 {
        append(&db, i..=i, None);
        records += RECORD_HEADER + encode(&entry(i)).unwrap().len() as u64;
    }
    let (written, end) = {
        let g = db.lock();
        (g.written, g.end)
    };
    assert!(records < ZERO_CHUNK, "all in the first chunk");
    assert_eq!((written, end), (records, SEGMENT_HEADER + records));
    // Past the first chunk: the write fills on to the next chunk's end.
    let big = "y".repeat(ZERO_CHUNK as usize);
    db.append(&[(201, big)], None::<&Option<u64>>).unwrap();
    assert_eq!(db.lock().written - written, 2 * ZERO_CHUNK - end);
    assert_eq!(all(&db).len(), 201);
}

/// A crash while a segment or the meta file was being made leaves a temp file, never a segment
/// without its header.
#[test]
fn half_made_files_are_not_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    append(&db, 1..=3, None);
    drop(db);
    let log = dir.path().join("log");
    fs::write(log.join("00000000000000000002.seg.tmp"), b"").unwrap();
    fs::write(log.join("meta.tmp"), b"gwlog").unwrap();
    let db = open(dir.path());
    assert_eq!(all(&db), expect(1..=3));
    assert!(!log.join("00000000000000000002.seg.tmp").exists() && !log.join("meta.tmp").exists());
    append(&db, 4..=40, None);
    drop(db);
    assert_eq!(all(&open(dir.path())), expect(1..=40));
}

/// A range is read in steps of at most READ_BYTES: every entry comes back, in order, whatever
/// the step boundaries.
#[test]
fn large_ranges_read_in_steps() {
    let dir = tempfile::tempdir().unwrap();
    let db = LogDb::open_sized::<u64>(dir.path(), SEGMENT_BYTES).unwrap();
    let big = |i: u64| format!("{i}{}", "z".repeat((READ_BYTES / 3) as usize));
    let entries: Vec<(u64, String)> = (1..=10).map(|i| (i, big(i))).collect();
    db.append(&entries, None::<&Option<u64>>).unwrap();
    let want: Vec<String> = (2..=9).map(big).collect();
    assert_eq!(db.entries::<String>(2..=9).unwrap(), want);
}

/// A migration that stopped after `log/` was in place but before the note: the next open writes
/// the note over the old `log.redb`, and reads the log it had.
#[test]
fn a_log_redb_left_beside_log_is_fenced_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    append(&db, 1..=2, None);
    drop(db);
    let legacy = log_redb::Legacy { entries: vec![(1, encode(&"old".to_string()).unwrap())], ..Default::default() };
    fs::remove_file(dir.path().join("log.redb")).unwrap();
    log_redb::write(&dir.path().join("log.redb"), &legacy).unwrap();
    let db = open(dir.path());
    assert_eq!(all(&db), expect(1..=2), "log/ is the log; the old file is not read again");
    assert!(fs::read(dir.path().join("log.redb")).unwrap().starts_with(log_redb::MOVED_NOTE));
}

#[test]
fn an_open_that_cannot_read_the_log_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the log's directory goes (an operator's `> data/log`, say).
    fs::write(dir.path().join("log"), b"not a directory").unwrap();
    let err = LogDb::open_sized::<u64>(dir.path(), SMALL).err().expect("a file in the log's place is refused");
    let log = dir.path().join("log");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{}: ", log.display())), "{msg}");
    let StoreError::Open { path, source } = &err else { panic!("{err:?}") };
    assert_eq!(path, &log);
    assert!(matches!(&**source, StoreError::Io(io) if io.kind() == io::ErrorKind::NotADirectory), "{err:?}");
    assert_eq!(fs::read(&log).unwrap(), b"not a directory", "nothing is written over it");
}
