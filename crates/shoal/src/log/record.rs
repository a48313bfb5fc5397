//! Log records and their on-disk framing.
//!
//! The log is redo-only and logical (data lives in memory): a transaction writes one
//! [`LogRecord::Commit`] holding the after-image of every key it changed, appended when it
//! commits, so replaying commit records in log order rebuilds the tables. After-images (not
//! deltas) make replay idempotent, which lets a fuzzy checkpoint overlap the log it covers.
//!
//! Frame: `len: u32 LE | crc: u32 LE | payload[len]`, where `crc` is CRC32C over the four
//! length bytes followed by the payload, so a torn length is caught too, XORed with a salt
//! derived from the frame's position (its LSN in the log, its offset in a checkpoint file;
//! the salt of position 0 is 0). A frame therefore checks out only where it was written: a
//! frame copied elsewhere (a log record stored inside a value, a segment file under the wrong
//! name) reads as damage, not as a record, so recovery can tell a torn tail from a damaged
//! record that valid records follow.
//!
//! The top bit of `len` ([`FLUSH_START`]) marks the first frame of each flush of the log: the
//! flusher sets it (and recomputes the checksum) just before it writes the flush. A flush is
//! written only once the one before it is durable, so a whole frame marked so, lying after a
//! damaged one, proves the damaged frame was durable: damage to committed data, not the torn
//! tail of the flush a crash cut short (whose sectors may reach the disk in any order).

/// Bytes of frame header before the payload.
pub const FRAME_HEADER: usize = 8;
/// Largest payload accepted when decoding (guards against reading garbage lengths).
pub const MAX_PAYLOAD: usize = 1 << 30;
/// The highest LSN a log may reach (2^62 bytes, centuries of logging at any rate): a file
/// named with a higher one is damaged or foreign, and LSN arithmetic stays far from
/// overflowing.
pub const MAX_LSN: u64 = 1 << 62;
/// The bit of a frame's `len` field that marks the first frame of a flush of the log (see the
/// module documentation); the payload's length is the field without it.
pub const FLUSH_START: u32 = 1 << 31;

const KIND_CREATE_TABLE: u8 = 1;
const KIND_COMMIT: u8 = 2;
const KIND_CHECKPOINT_END: u8 = 3;
const KIND_OPS: u8 = 4;
const KIND_CLOSE: u8 = 5;

/// One split operation in an [`LogRecord::Ops`] record (Doppel split phases).
///
/// ```
/// use shoal::log::record::{decode_frame, Frame, LogRecord, OpWrite};
/// let rec = LogRecord::Ops {
///     txn: 1,
///     writes: vec![],
///     ops: vec![OpWrite { table: 1, key: b"hot".to_vec(), op: vec![1, 0, 0, 0, 0, 0, 0, 0, 0] }],
/// };
/// let bytes = rec.encode();
/// assert_eq!(decode_frame(&bytes), Frame::Record(rec, bytes.len()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpWrite {
    /// Table id.
    pub table: u32,
    /// The key.
    pub key: Vec<u8>,
    /// The operation and its argument, in the engine's internal encoding (a tag byte, then
    /// the argument).
    pub op: Vec<u8>,
}

/// One key's after-image in a commit record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// Table id.
    pub table: u32,
    /// The key.
    pub key: Vec<u8>,
    /// The new value, or `None` when the key was deleted.
    pub value: Option<Vec<u8>>,
}

/// A log record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    /// A table was created.
    CreateTable {
        /// Its id.
        id: u32,
        /// Its name.
        name: String,
    },
    /// A transaction committed with these after-images.
    Commit {
        /// The transaction id.
        txn: u64,
        /// After-images, at most one per key.
        writes: Vec<Write>,
    },
    /// A Doppel split-phase transaction committed: after-images of its joined writes plus
    /// the split operations it applied to per-worker slices. Replay applies the writes, then
    /// the operations to the current values.
    Ops {
        /// The transaction id.
        txn: u64,
        /// After-images, at most one per key.
        writes: Vec<Write>,
        /// Split operations, in the order the transaction issued them.
        ops: Vec<OpWrite>,
    },
    /// The last record of a checkpoint file: the checkpoint covers the log below `lsn` and
    /// holds `records` records before this one.
    CheckpointEnd {
        /// Replay starts here.
        lsn: u64,
        /// Number of records in the file before this one.
        records: u64,
    },
    /// The log was closed cleanly here: the last record a clean close writes, in a flush of
    /// its own, so that every earlier flush is followed by a later one. Damage in the last
    /// flush of a log reads as the torn tail of a crash; after a clean close the last flush
    /// is this record's, and damage to any commit is reported. Replay skips it.
    Close,
}

impl LogRecord {
    /// Appends the framed record to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0u8; FRAME_HEADER]);
        match self {
            LogRecord::CreateTable { id, name } => {
                out.push(KIND_CREATE_TABLE);
                out.extend_from_slice(&id.to_le_bytes());
                put_bytes(out, name.as_bytes());
            }
            LogRecord::Commit { txn, writes } => {
                out.push(KIND_COMMIT);
                out.extend_from_slice(&txn.to_le_bytes());
                put_writes(out, writes);
            }
            LogRecord::Ops { txn, writes, ops } => {
                out.push(KIND_OPS);
                out.extend_from_slice(&txn.to_le_bytes());
                put_writes(out, writes);
                out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
                for o in ops {
                    out.extend_from_slice(&o.table.to_le_bytes());
                    put_bytes(out, &o.key);
                    put_bytes(out, &o.op);
                }
            }
            LogRecord::CheckpointEnd { lsn, records } => {
                out.push(KIND_CHECKPOINT_END);
                out.extend_from_slice(&lsn.to_le_bytes());
                out.extend_from_slice(&records.to_le_bytes());
            }
            LogRecord::Close => out.push(KIND_CLOSE),
        }
        let len = (out.len() - start - FRAME_HEADER) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(&len.to_le_bytes()),
            &out[start + FRAME_HEADER..],
        );
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// The framed record as a new vector.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }
}

fn put_writes(out: &mut Vec<u8>, writes: &[Write]) {
    out.extend_from_slice(&(writes.len() as u32).to_le_bytes());
    for w in writes {
        out.extend_from_slice(&w.table.to_le_bytes());
        put_bytes(out, &w.key);
        match &w.value {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                put_bytes(out, v);
            }
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// The checksum salt of a frame at position `at` (0 for position 0).
///
/// ```
/// use shoal::log::record::frame_salt;
/// assert_eq!(frame_salt(0), 0);
/// assert_ne!(frame_salt(1), frame_salt(2));
/// ```
pub fn frame_salt(at: u64) -> u32 {
    let x = at.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x ^ (x >> 29) ^ (x >> 32)) as u32
}

/// Moves the encoded frame at the start of `frame` from position `from` to position `to`
/// (re-salts its checksum; [`LogRecord::encode`] places a frame at position 0).
///
/// ```
/// use shoal::log::record::{decode_frame_at, place_frame, Frame, LogRecord};
/// let rec = LogRecord::CreateTable { id: 1, name: "t".into() };
/// let mut bytes = rec.encode();
/// place_frame(&mut bytes, 0, 4096);
/// assert_eq!(decode_frame_at(&bytes, 4096), Frame::Record(rec, bytes.len()));
/// assert!(matches!(decode_frame_at(&bytes, 0), Frame::Bad(_)));
/// ```
pub fn place_frame(frame: &mut [u8], from: u64, to: u64) {
    let salt = frame_salt(from) ^ frame_salt(to);
    if let Some(c) = frame.get_mut(4..8) {
        let crc = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) ^ salt;
        c.copy_from_slice(&crc.to_le_bytes());
    }
}

/// What [`decode_frame`] found at an offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A whole, checksummed record and the number of bytes it took.
    Record(LogRecord, usize),
    /// The bytes end inside a frame (a torn tail when it is the end of the log).
    Truncated,
    /// The frame is complete but its checksum or contents are wrong.
    Bad(String),
}

/// Decodes the frame at the start of `buf`, placed at position 0. Never panics, whatever the
/// bytes.
pub fn decode_frame(buf: &[u8]) -> Frame {
    decode_frame_at(buf, 0)
}

/// Decodes the frame at the start of `buf`, which sits at position `at` (an LSN in the log,
/// an offset in a checkpoint file). Never panics, whatever the bytes.
pub fn decode_frame_at(buf: &[u8], at: u64) -> Frame {
    if buf.len() < FRAME_HEADER {
        return Frame::Truncated;
    }
    let len = (u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) & !FLUSH_START) as usize;
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) ^ frame_salt(at);
    if len > MAX_PAYLOAD {
        return Frame::Bad(format!("implausible record length {len}"));
    }
    let Some(payload) = buf.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return Frame::Truncated;
    };
    let want = crc32c::crc32c_append(crc32c::crc32c(&buf[0..4]), payload);
    if want != crc {
        return Frame::Bad(format!(
            "checksum mismatch (stored {crc:#010x}, computed {want:#010x})"
        ));
    }
    match decode_payload(payload) {
        Ok(r) => Frame::Record(r, FRAME_HEADER + len),
        Err(e) => Frame::Bad(e),
    }
}

/// True if a whole, checksummed frame carrying the [`FLUSH_START`] mark, placed at `at`,
/// starts `buf`: [`decode_frame_at`] finds a record there and [`starts_flush`] holds.
///
/// Made for recovery's search for a later flush after damaged bytes, which probes every
/// offset of what may be megabytes of random-looking values: the payload's structure is
/// checked before its checksum. Checksum first, each offset whose length field happened to
/// fit cost a pass over up to the rest of the log, and a torn 16 MiB flush of
/// incompressible values took a minute to open (the work grew with the cube of its size);
/// structure first, random bytes fail within a few bytes of their kind and length fields.
///
/// ```
/// use shoal::log::record::{is_flush_start_at, mark_flush_start, LogRecord};
/// let mut bytes = LogRecord::Close.encode();
/// assert!(!is_flush_start_at(&bytes, 0));
/// mark_flush_start(&mut bytes, 0);
/// assert!(is_flush_start_at(&bytes, 0));
/// bytes[8] ^= 1; // the kind byte
/// assert!(!is_flush_start_at(&bytes, 0));
/// ```
pub fn is_flush_start_at(buf: &[u8], at: u64) -> bool {
    if buf.len() < FRAME_HEADER || !starts_flush(buf) {
        return false;
    }
    let len = (u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) & !FLUSH_START) as usize;
    if len == 0 || len > MAX_PAYLOAD {
        return false;
    }
    let Some(payload) = buf.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return false;
    };
    if decode_payload(payload).is_err() {
        return false;
    }
    let crc = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) ^ frame_salt(at);
    crc32c::crc32c_append(crc32c::crc32c(&buf[0..4]), payload) == crc
}

/// True if the frame at the start of `buf` carries the [`FLUSH_START`] mark (meaningful only
/// for a frame that [`decode_frame_at`] found whole: the checksum covers the mark).
pub fn starts_flush(buf: &[u8]) -> bool {
    buf.get(3).is_some_and(|b| b & 0x80 != 0)
}

/// Marks the whole frame at the start of `frame`, placed at position `at`, as the first of a
/// flush ([`FLUSH_START`]), recomputing its checksum (a no-op if `frame` is shorter than
/// the frame).
pub fn mark_flush_start(frame: &mut [u8], at: u64) {
    let Some(head) = frame.get(..FRAME_HEADER) else {
        return;
    };
    let raw = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) | FLUSH_START;
    let len = (raw & !FLUSH_START) as usize;
    let Some(payload) = frame.get(FRAME_HEADER..FRAME_HEADER + len) else {
        return;
    };
    let crc = crc32c::crc32c_append(crc32c::crc32c(&raw.to_le_bytes()), payload);
    frame[..4].copy_from_slice(&raw.to_le_bytes());
    frame[4..8].copy_from_slice(&(crc ^ frame_salt(at)).to_le_bytes());
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).ok_or("length overflow")?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| format!("record ends early at byte {}", self.pos))?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

fn read_writes(r: &mut Reader<'_>, payload_len: usize) -> Result<Vec<Write>, String> {
    let n = r.u32()? as usize;
    // Each write takes at least 9 bytes: never trust `n` for an allocation.
    let mut writes = Vec::with_capacity(n.min(payload_len / 9));
    for _ in 0..n {
        let table = r.u32()?;
        let key = r.bytes()?;
        let value = match r.u8()? {
            0 => None,
            1 => Some(r.bytes()?),
            t => return Err(format!("unknown value tag {t}")),
        };
        writes.push(Write { table, key, value });
    }
    Ok(writes)
}

fn decode_payload(payload: &[u8]) -> Result<LogRecord, String> {
    let mut r = Reader {
        buf: payload,
        pos: 0,
    };
    let rec = match r.u8()? {
        KIND_CREATE_TABLE => {
            let id = r.u32()?;
            let name = String::from_utf8(r.bytes()?).map_err(|_| "table name is not UTF-8")?;
            LogRecord::CreateTable { id, name }
        }
        KIND_COMMIT => {
            let txn = r.u64()?;
            let writes = read_writes(&mut r, payload.len())?;
            LogRecord::Commit { txn, writes }
        }
        KIND_OPS => {
            let txn = r.u64()?;
            let writes = read_writes(&mut r, payload.len())?;
            let n = r.u32()? as usize;
            let mut ops = Vec::with_capacity(n.min(payload.len() / 12));
            for _ in 0..n {
                let table = r.u32()?;
                let key = r.bytes()?;
                let op = r.bytes()?;
                ops.push(OpWrite { table, key, op });
            }
            LogRecord::Ops { txn, writes, ops }
        }
        KIND_CHECKPOINT_END => LogRecord::CheckpointEnd {
            lsn: r.u64()?,
            records: r.u64()?,
        },
        KIND_CLOSE => LogRecord::Close,
        k => return Err(format!("unknown record kind {k}")),
    };
    if r.pos != payload.len() {
        return Err(format!(
            "{} trailing bytes after the record",
            payload.len() - r.pos
        ));
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> LogRecord {
        LogRecord::Commit {
            txn: 42,
            writes: vec![
                Write {
                    table: 1,
                    key: b"k".to_vec(),
                    value: Some(b"value".to_vec()),
                },
                Write {
                    table: 2,
                    key: vec![0, 255],
                    value: None,
                },
            ],
        }
    }

    #[test]
    fn round_trip() {
        for rec in [
            sample(),
            LogRecord::CreateTable {
                id: 7,
                name: "accounts".into(),
            },
            LogRecord::Ops {
                txn: 9,
                writes: vec![Write {
                    table: 1,
                    key: b"j".to_vec(),
                    value: None,
                }],
                ops: vec![OpWrite {
                    table: 2,
                    key: b"hot".to_vec(),
                    op: vec![1, 2, 3],
                }],
            },
            LogRecord::Close,
        ] {
            let bytes = rec.encode();
            assert_eq!(decode_frame(&bytes), Frame::Record(rec, bytes.len()));
        }
    }

    #[test]
    fn a_flush_start_mark_keeps_the_frame_whole_and_is_checksummed() {
        let rec = sample();
        let mut bytes = rec.encode();
        place_frame(&mut bytes, 0, 777);
        assert!(!starts_flush(&bytes));
        mark_flush_start(&mut bytes, 777);
        assert!(starts_flush(&bytes));
        assert_eq!(
            decode_frame_at(&bytes, 777),
            Frame::Record(rec, bytes.len())
        );
        // The mark is under the checksum: clearing it is damage.
        let mut cleared = bytes.clone();
        cleared[3] &= 0x7f;
        assert!(matches!(decode_frame_at(&cleared, 777), Frame::Bad(_)));
    }

    #[test]
    fn every_prefix_is_truncated_and_every_bit_flip_is_caught() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            assert_eq!(decode_frame(&bytes[..cut]), Frame::Truncated, "cut {cut}");
        }
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            match decode_frame(&b) {
                Frame::Record(..) => panic!("flip of bit {i} went unnoticed"),
                Frame::Truncated | Frame::Bad(_) => {}
            }
        }
    }

    #[test]
    fn a_frame_checks_out_only_where_it_was_placed() {
        let mut bytes = sample().encode();
        place_frame(&mut bytes, 0, 77);
        assert!(matches!(decode_frame_at(&bytes, 77), Frame::Record(..)));
        for at in [0, 76, 78, 77 + 4096, 1 << 40] {
            assert!(
                matches!(decode_frame_at(&bytes, at), Frame::Bad(_)),
                "at {at}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = decode_frame(&b);
        }
    }
}
