//! The snapshot a node keeps for followers that need one (the last it built or installed), in
//! `state.redb` but outside the state: its bytes in chunks of just under a MiB
//! (`snapshot_chunks`, keyed 0, 1, …), its order and length under `chunked` in `snapshot`.
//!
//! A million devices' snapshot is ~57 MB. Stored as one value, every save had redb zero-fill a
//! buffer of its size before the copy, every read (a follower's catch-up) copied all of it out of
//! a page of its size, and every save read the stored one whole to learn its order. In chunks, a
//! save and a read hold one chunk besides the snapshot, and the order is one small row.
//!
//! A file written before holds the whole record (`codec::encode_with_bytes(order, bytes)`) under
//! `current`: it is read as before, and the next save or install removes it. Every save of this
//! build removes it in the same transaction, so a `current` found beside `chunked` was written
//! later, by an earlier build the node was rolled back to: it is the kept one.

use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata, WriteTransaction};

use super::schema::{SNAPSHOT, SNAPSHOT_CHUNKS};
use super::StoreError;
use crate::codec::{decode, decode_with_bytes, encode};

/// The layout before chunks: the whole record under one key.
const WHOLE: &str = "current";
/// The chunked layout's order and length.
const CHUNKED: &str = "chunked";
/// Bytes a chunk holds, but for the last: a MiB less a page, so that a chunk and its leaf's
/// header fit in one 1 MiB redb page. A read takes chunks of any length.
pub(super) const CHUNK: usize = (1 << 20) - 4096;
/// Room a read leaves after the bytes, for a head to be put in front of them without a second
/// buffer (the snapshot RPC's: `raft::network::snapshot_body`).
pub const SPARE: usize = 64;

/// The stored snapshot's order, if one is stored.
fn stored_order(txn: &WriteTransaction) -> Result<Option<u64>, StoreError> {
    let t = txn.open_table(SNAPSHOT)?;
    if let Some(whole) = t.get(WHOLE)? {
        return Ok(Some(decode_with_bytes::<u64>(whole.value())?.0));
    }
    let head = t.get(CHUNKED)?;
    Ok(head.map(|head| decode::<(u64, u64)>(head.value()).map(|(order, _len)| order)).transpose()?)
}

/// Stores the snapshot whose bytes are `parts`, in order, as the kept one, unless `replace` is
/// false and one of `order` or newer is stored.
pub(super) fn put(txn: &WriteTransaction, order: u64, parts: &[&[u8]], replace: bool) -> Result<(), StoreError> {
    if !replace && stored_order(txn)?.is_some_and(|stored| stored >= order) {
        return Ok(());
    }
    let len: usize = parts.iter().map(|p| p.len()).sum();
    txn.delete_table(SNAPSHOT_CHUNKS)?;
    let mut chunks = txn.open_table(SNAPSHOT_CHUNKS)?;
    let mut rest = parts.iter().copied().filter(|p| !p.is_empty());
    let mut part: &[u8] = &[];
    let (mut left, mut key) = (len, 0u32);
    while left > 0 {
        let n = left.min(CHUNK);
        let mut value = chunks.insert_reserve(key, n)?;
        let out = value.as_mut();
        let mut filled = 0;
        while filled < n {
            if part.is_empty() {
                part =
                    rest.next().ok_or_else(|| StoreError::Corrupt("snapshot parts shorter than their sum".into()))?;
            }
            let take = part.len().min(n - filled);
            out[filled..filled + take].copy_from_slice(&part[..take]);
            (filled, part) = (filled + take, &part[take..]);
        }
        left -= n;
        key += 1;
    }
    let mut t = txn.open_table(SNAPSHOT)?;
    t.remove(WHOLE)?;
    t.insert(CHUNKED, encode(&(order, len as u64))?.as_slice())?;
    Ok(())
}

/// The kept snapshot's bytes, copied once into a `Vec` of their size and [`SPARE`] bytes more.
pub(super) fn read(txn: &ReadTransaction) -> Result<Option<Vec<u8>>, StoreError> {
    let t = txn.open_table(SNAPSHOT)?;
    if let Some(whole) = t.get(WHOLE)? {
        let (_order, bytes) = decode_with_bytes::<u64>(whole.value())?;
        let mut out = Vec::with_capacity(bytes.len() + SPARE);
        out.extend_from_slice(bytes);
        return Ok(Some(out));
    }
    let Some(head) = t.get(CHUNKED)? else { return Ok(None) };
    let (_order, len): (u64, u64) = decode(head.value())?;
    let chunks = txn.open_table(SNAPSHOT_CHUNKS)?;
    let count = chunks.len()?;
    let corrupt = || StoreError::Corrupt(format!("the kept snapshot of {len} bytes is stored in {count} chunks"));
    let len = usize::try_from(len).map_err(|_| corrupt())?;
    // Sized up front only when the chunks stored could hold it at a MiB each: a damaged length
    // never sizes a buffer past what the file holds.
    let fits = count.checked_mul(1 << 20).is_some_and(|most| len as u64 <= most);
    let mut bytes = Vec::with_capacity(if fits { len + SPARE } else { 0 });
    for (at, row) in chunks.iter()?.enumerate() {
        let (key, chunk) = row?;
        let chunk = chunk.value();
        if key.value() as usize != at || bytes.len() + chunk.len() > len {
            return Err(corrupt());
        }
        bytes.extend_from_slice(chunk);
    }
    if bytes.len() != len {
        return Err(corrupt());
    }
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use redb::{Database, ReadableDatabase};

    use super::*;
    use crate::codec::encode_with_bytes;

    fn db() -> (tempfile::TempDir, Database) {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(SNAPSHOT).unwrap();
        txn.commit().unwrap();
        (dir, db)
    }

    fn put_in(db: &Database, order: u64, parts: &[&[u8]], replace: bool) {
        let txn = db.begin_write().unwrap();
        put(&txn, order, parts, replace).unwrap();
        txn.commit().unwrap();
    }

    fn read_from(db: &Database) -> Result<Option<Vec<u8>>, StoreError> {
        read(&db.begin_read().unwrap())
    }

    fn chunks_in(db: &Database) -> u64 {
        db.begin_read().unwrap().open_table(SNAPSHOT_CHUNKS).unwrap().len().unwrap()
    }

    #[test]
    fn a_kept_snapshot_reads_back_whole_across_chunks_and_a_smaller_one_leaves_none_behind() {
        let (_dir, db) = db();
        assert_eq!(read_from(&db).unwrap(), None);
        let data: Vec<u8> = (0..CHUNK * 5 / 2 + 3).map(|i| (i % 251) as u8).collect();
        // Parts meet inside a chunk, and one is empty.
        let parts: [&[u8]; 4] = [b"meta:7!", &data[..CHUNK + 10], b"", &data[CHUNK + 10..]];
        put_in(&db, 3, &parts, false);
        assert_eq!(read_from(&db).unwrap(), Some(parts.concat()));
        assert_eq!(chunks_in(&db), 3);
        put_in(&db, 4, &[b"x"], false);
        assert_eq!(read_from(&db).unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(chunks_in(&db), 1);
        put_in(&db, 5, &[], false);
        assert_eq!(read_from(&db).unwrap(), Some(vec![]));
        assert_eq!(chunks_in(&db), 0);
    }

    #[test]
    fn a_snapshot_kept_whole_by_an_earlier_build_is_read_and_the_next_save_replaces_it() {
        let (_dir, db) = db();
        let whole: Vec<u8> = (0..3 * CHUNK).map(|i| (i % 13) as u8).collect();
        let txn = db.begin_write().unwrap();
        txn.open_table(SNAPSHOT).unwrap().insert(WHOLE, encode_with_bytes(&7u64, &whole).unwrap().as_slice()).unwrap();
        txn.commit().unwrap();
        assert_eq!(read_from(&db).unwrap(), Some(whole.clone()));
        put_in(&db, 6, &[b"older"], false);
        assert_eq!(read_from(&db).unwrap(), Some(whole), "an older build never replaces it");
        put_in(&db, 8, &[b"newer"], false);
        assert_eq!(read_from(&db).unwrap().as_deref(), Some(&b"newer"[..]));
        let txn = db.begin_read().unwrap();
        assert!(txn.open_table(SNAPSHOT).unwrap().get(WHOLE).unwrap().is_none(), "the whole record is gone");
    }

    #[test]
    fn a_whole_record_an_earlier_build_wrote_after_a_rollback_is_the_kept_one() {
        let (_dir, db) = db();
        put_in(&db, 5, &[b"chunks of five"], false);
        // Rolled back: that build keeps the whole record under `current` and knows no chunks.
        let txn = db.begin_write().unwrap();
        txn.open_table(SNAPSHOT).unwrap().insert(WHOLE, encode_with_bytes(&9u64, b"nine").unwrap().as_slice()).unwrap();
        txn.commit().unwrap();
        // Upgraded again: the newer whole record is read, and kept against an older build.
        assert_eq!(read_from(&db).unwrap().as_deref(), Some(&b"nine"[..]));
        put_in(&db, 7, &[b"seven"], false);
        assert_eq!(read_from(&db).unwrap().as_deref(), Some(&b"nine"[..]));
        put_in(&db, 10, &[b"ten"], false);
        assert_eq!(read_from(&db).unwrap().as_deref(), Some(&b"ten"[..]));
    }

    #[test]
    fn a_read_leaves_room_for_a_head() {
        let (_dir, db) = db();
        let data = vec![7u8; CHUNK + 1];
        put_in(&db, 1, &[&data], false);
        let read = read_from(&db).unwrap().unwrap();
        assert_eq!(read, data);
        assert!(read.capacity() >= data.len() + SPARE, "{} of {}", read.capacity(), data.len());
    }

    #[test]
    fn chunks_that_do_not_add_up_are_an_error() {
        let (_dir, db) = db();
        let data = vec![1u8; 2 * CHUNK];
        type Damage = fn(&WriteTransaction);
        let damage: [(&str, Damage); 3] = [
            ("a chunk missing", |txn| {
                txn.open_table(SNAPSHOT_CHUNKS).unwrap().remove(1).unwrap();
            }),
            ("a chunk cut short", |txn| {
                txn.open_table(SNAPSHOT_CHUNKS).unwrap().insert(0, &[1u8; 10][..]).unwrap();
            }),
            ("a length past the chunks", |txn| {
                let head = encode(&(9u64, 5 * CHUNK as u64)).unwrap();
                txn.open_table(SNAPSHOT).unwrap().insert(CHUNKED, head.as_slice()).unwrap();
            }),
        ];
        for (what, damage) in damage {
            put_in(&db, 9, &[&data], true);
            let txn = db.begin_write().unwrap();
            damage(&txn);
            txn.commit().unwrap();
            let err = read_from(&db).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt(_)), "{what}: {err}");
        }
    }
}
