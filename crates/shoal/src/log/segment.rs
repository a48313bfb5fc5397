//! Log segment files: `log-<start LSN, 20 digits>.seg`, each holding the log bytes from its
//! start LSN on, whole records only. Also reading the log back for recovery.

use std::path::{Path, PathBuf};

use super::record::{decode_frame_at, is_flush_start_at, starts_flush, Frame, LogRecord, MAX_LSN};
use crate::error::{Error, Result};
use crate::vfs::{on, VFile, Vfs};

const PREFIX: &str = "log-";
const SUFFIX: &str = ".seg";

/// The path of the segment starting at `start`.
pub(crate) fn path(dir: &Path, start: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{start:020}{SUFFIX}"))
}

/// Fsyncs a directory so that file creations, renames and removals in it are durable.
pub(crate) fn sync_dir(vfs: &dyn Vfs, dir: &Path) -> Result<()> {
    vfs.sync_dir(dir).map_err(on("fsync-dir", dir))
}

/// Creates the segment starting at `start`, durably. An empty file of that name (a segment
/// started just before a crash) is reused; one with contents is never overwritten.
pub(crate) fn create(vfs: &dyn Vfs, dir: &Path, start: u64) -> Result<Box<dyn VFile>> {
    let p = path(dir, start);
    let mut f = match vfs.create_new(&p) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let len = vfs.read(&p).map_err(on("read", &p))?.len();
            if len != 0 {
                return Err(Error::Corrupt {
                    path: p,
                    offset: 0,
                    detail: format!(
                        "a log segment is to start at LSN {start}, but a file of {len} bytes \
                         has its name already"
                    ),
                });
            }
            vfs.open_write(&p).map_err(on("open", &p))?
        }
        Err(e) => return Err(crate::vfs::io_error("create", &p, e)),
    };
    f.sync().map_err(on("fsync", &p))?;
    sync_dir(vfs, dir)?;
    Ok(f)
}

/// The segments in `dir`, sorted by start LSN.
pub(crate) fn list(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    list_numbered(vfs, dir, PREFIX, SUFFIX)
}

/// Files in `dir` named `<prefix><number><suffix>`, sorted by number.
pub(crate) fn list_numbered(
    vfs: &dyn Vfs,
    dir: &Path,
    prefix: &str,
    suffix: &str,
) -> Result<Vec<(u64, PathBuf)>> {
    let mut v = Vec::new();
    for name in vfs.list(dir).map_err(on("list", dir))? {
        if let Some(num) = name
            .strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(suffix))
        {
            if let Ok(n) = num.parse::<u64>() {
                let path = dir.join(&name);
                if n > MAX_LSN {
                    // No log reaches this (2^62 bytes); arithmetic on LSNs past it could
                    // overflow. A damaged or foreign name, not one to skip: it may hold
                    // the only copy of committed data.
                    return Err(Error::Corrupt {
                        path,
                        offset: 0,
                        detail: format!("a file name with LSN {n}, beyond any log's end"),
                    });
                }
                v.push((n, path));
            }
        }
    }
    v.sort();
    Ok(v)
}

/// What reading the log found.
pub(crate) struct LogScan {
    /// The end of the last whole record: where the next record goes.
    pub end: u64,
    /// Bytes cut from a torn tail.
    pub torn_bytes: u64,
    /// Where the cut bytes were kept.
    pub torn_file: Option<PathBuf>,
}

/// Reads every record with LSN >= `from` (and below `upto`, if given), in log order, calling
/// `apply(lsn, record)`.
///
/// With `upto` the read is of a log known durable up to there (a checkpoint looking up
/// committed values): it writes nothing, and anything below `upto` that does not decode is
/// `Error::Corrupt`, as is a log ending below it. Without `upto` (recovery), the end of the
/// last segment may hold a torn tail (the last flush, cut short by a crash, with any of its
/// sectors lost): bytes that do not decode, after which no whole frame starts a later flush
/// (whole frames of the same flush may follow). It is cut off, and the cut bytes are first
/// kept in `torn-<LSN>.bin` beside the segment (open never destroys bytes it could not
/// read). Bytes that do not decode but are followed by the whole first frame of a later
/// flush were durable: damage to committed data, `Error::Corrupt` with the file and offset,
/// and nothing is changed. Zeros from a record boundary to the end of the last segment are
/// the zeros the flusher writes ahead of the log (a crash left them): they end the log, and
/// are cut.
pub(crate) fn replay(
    vfs: &dyn Vfs,
    dir: &Path,
    from: u64,
    upto: Option<u64>,
    mut apply: impl FnMut(u64, LogRecord) -> Result<()>,
) -> Result<LogScan> {
    let segs = list(vfs, dir)?;
    if segs.is_empty() && from > 0 && upto.is_none() {
        // A checkpoint exists, so a log did: the engine never deletes its last segment.
        // Opening would silently drop every commit after the checkpoint.
        return Err(Error::Corrupt {
            path: dir.to_path_buf(),
            offset: from,
            detail: format!(
                "a checkpoint at LSN {from}, but the log directory holds no log segment: the \
                 log after the checkpoint is missing (a wrong or emptied log directory?)"
            ),
        });
    }
    let limit = upto.unwrap_or(u64::MAX);
    let mut end = from;
    let mut torn_bytes = 0;
    let mut torn_file = None;
    // The last segment, its bytes, where its last flush starts and where the log ends.
    let mut tail: Option<(&PathBuf, Vec<u8>, usize, usize)> = None;
    for (i, (start, p)) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let next_start = segs.get(i + 1).map(|s| s.0);
        if next_start.is_some_and(|n| n <= from) {
            continue; // wholly before the checkpoint
        }
        if *start >= limit {
            break;
        }
        let bytes = vfs.read(p).map_err(on("read", p))?;
        if *start > end {
            return Err(Error::Corrupt {
                path: p.clone(),
                offset: 0,
                detail: format!(
                    "log gap: previous segment ends at LSN {end}, this one starts at {start}"
                ),
            });
        }
        let mut off = 0usize;
        // The last frame marked as the first of a flush (0: the flush began in an earlier
        // segment, or none is marked).
        let mut flush_at = 0usize;
        while off < bytes.len() && start + (off as u64) < limit {
            let lsn = start + off as u64;
            let detail = match decode_frame_at(&bytes[off..], lsn) {
                Frame::Record(rec, n) => {
                    if starts_flush(&bytes[off..]) {
                        flush_at = off;
                    }
                    if lsn >= from {
                        apply(lsn, rec)?;
                    }
                    off += n;
                    continue;
                }
                Frame::Truncated => "a record is cut short".to_string(),
                Frame::Bad(detail) => detail,
            };
            if upto.is_none() && last && bytes[off..].iter().all(|&b| b == 0) {
                // The end of the log, in zeros the flusher wrote ahead of it
                // (`buffer::ALLOCATE_AHEAD`): cut them, so that the segment holds whole
                // records only once a later one follows it.
                truncate(vfs, p, off as u64)?;
                break;
            }
            if upto.is_none() && last && !flush_starts_after(&bytes, *start, off) {
                // A torn tail: no later flush follows. Keep its bytes aside (up to the end of
                // the last 4 KiB block that is not all zeros: the rest is zeros written ahead
                // of the log), then cut it.
                // A name of its own: a torn tail kept by an earlier crash at the same LSN
                // (the next run's first flush, torn too) is bytes nobody has read either.
                let (keep, mut f) = create_unique(vfs, dir, lsn)?;
                let kept = &bytes[off..nonzero_end(&bytes, off)];
                let saved = f
                    .write_all(kept)
                    .map_err(on("write", &keep))
                    .and_then(|()| f.sync().map_err(on("fsync", &keep)))
                    .and_then(|()| sync_dir(vfs, dir));
                if let Err(e) = saved {
                    // (A full disk, say.) Nothing was cut: the next open keeps the bytes
                    // again, under the same name, rather than leaving one more file behind
                    // each time until no name is left.
                    drop(f);
                    let _ = vfs.remove(&keep);
                    return Err(e);
                }
                truncate(vfs, p, off as u64)?;
                torn_bytes = kept.len() as u64;
                torn_file = Some(keep);
                break;
            }
            return Err(Error::Corrupt {
                path: p.clone(),
                offset: off as u64,
                detail: if upto.is_some() {
                    format!("{detail}, below LSN {limit}, which is durable")
                } else if last {
                    format!("{detail}, and a later flush of the log follows it")
                } else {
                    format!("{detail}, in a segment that is not the last")
                },
            });
        }
        end = start + off as u64;
        if last {
            // (No next segment to check it against.)
            tail = Some((p, bytes, flush_at, off));
            continue;
        }
        if let Some(n) = next_start.filter(|_| off == bytes.len()) {
            if n != end && !last {
                return Err(Error::Corrupt {
                    path: p.clone(),
                    offset: off as u64,
                    detail: format!("segment ends at LSN {end} but the next one starts at {n}"),
                });
            }
        }
    }
    if upto.is_none() && end < from {
        // A checkpoint flushes the log up to its LSN and no segment holding it is ever
        // deleted: a log that ends before it lost its newer segments (an older copy of the
        // log directory, say). Opening would silently drop every commit after the checkpoint.
        return Err(Error::Corrupt {
            path: dir.to_path_buf(),
            offset: end,
            detail: format!(
                "the log ends at LSN {end}, before the checkpoint at LSN {from}: the log \
                 after the checkpoint is missing (an older copy of the log directory?)"
            ),
        });
    }
    if let Some((p, bytes, flush_at, len)) = tail.filter(|_| upto.is_none()) {
        // What recovery replayed becomes the base of the next run, which acknowledges
        // commits in segments after it: make it durable first. A flush whose bytes were
        // written but whose fsync failed (or never ran) and that ends where its file ends
        // is not cut above, and a power loss could otherwise take it from under them. After
        // a failed fsync, Linux marks the pages it could not write clean: reads still see
        // them, and no later fsync writes them. A failed fsync ends the log (nothing is
        // flushed after it, a clean close's record included), so only the last flush can
        // hold such bytes: it is written again before the fsync.
        let mut f = vfs.open_write(p).map_err(on("open", p))?;
        if flush_at < len {
            f.write_at(flush_at as u64, &bytes[flush_at..len])
                .map_err(on("write", p))?;
        }
        f.sync().map_err(on("fsync", p))?;
    }
    if upto.is_some_and(|u| end.max(from) != u) {
        return Err(Error::Corrupt {
            path: dir.to_path_buf(),
            offset: end,
            detail: format!("the log reaches LSN {end}, not the durable LSN {limit}"),
        });
    }
    Ok(LogScan {
        end: end.max(from),
        torn_bytes,
        torn_file,
    })
}

/// The end of the last 4 KiB block of `bytes` (offsets within the file) that holds a byte
/// other than zero, and not below `off`: the zeros written ahead of the log fill whole blocks
/// (`buffer::ALLOCATE_AHEAD` is a multiple of 4 KiB), and torn bytes are kept to the end of
/// their block, zeros included.
fn nonzero_end(bytes: &[u8], off: usize) -> usize {
    match bytes[off..].iter().rposition(|&b| b != 0) {
        Some(i) => ((off + i + 1).div_ceil(4096) * 4096).min(bytes.len()),
        None => off,
    }
}

/// True if a whole, checksummed frame placed where it lies and marked as the first of a
/// flush ([`FLUSH_START`](super::record::FLUSH_START)) starts anywhere after `off`. The flusher writes a flush only once
/// the one before it is durable, so such a frame proves the bytes at `off` were durable:
/// damage there is corruption of committed data, not a torn tail. A crash tears only the
/// last flush, and a flush's sectors may reach the disk in any order, so whole frames may
/// follow a hole in it; none of them starts a later flush.
fn flush_starts_after(bytes: &[u8], start: u64, off: usize) -> bool {
    // Linear in the bytes after `off` for any data but frames laid out on purpose (see
    // `is_flush_start_at`).
    (off + 1..bytes.len()).any(|o| is_flush_start_at(&bytes[o..], start + o as u64))
}

fn truncate(vfs: &dyn Vfs, p: &Path, len: u64) -> Result<()> {
    let mut f = vfs.open_write(p).map_err(on("open", p))?;
    f.set_len(len).map_err(on("truncate", p))?;
    f.sync().map_err(on("fsync", p))
}

/// Creates `torn-LSN.bin` in `dir`, or `torn-LSN-N.bin` with the first free `N` when an
/// earlier crash left one at the same LSN.
fn create_unique(vfs: &dyn Vfs, dir: &Path, lsn: u64) -> Result<(PathBuf, Box<dyn VFile>)> {
    let mut n = 0u32;
    loop {
        let keep = match n {
            0 => dir.join(format!("torn-{lsn:020}.bin")),
            n => dir.join(format!("torn-{lsn:020}-{n}.bin")),
        };
        match vfs.create_new(&keep) {
            Ok(f) => return Ok((keep, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                // An empty one holds nothing (a crash right after its creation): take its
                // name again.
                if vfs.read(&keep).is_ok_and(|b| b.is_empty()) && vfs.remove(&keep).is_ok() {
                    continue;
                }
                n += 1;
            }
            Err(e) => return Err(on("create", &keep)(e)),
        }
    }
}
