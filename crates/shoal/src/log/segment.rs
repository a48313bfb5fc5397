//! Log segment files: `log-<start LSN, 20 digits>.seg`, each holding the log bytes from its
//! start LSN on, whole records only. Also reading the log back for recovery.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use super::record::{decode_frame, Frame, LogRecord};
use crate::error::{Error, Result};

const PREFIX: &str = "log-";
const SUFFIX: &str = ".seg";

/// The path of the segment starting at `start`.
pub(crate) fn path(dir: &Path, start: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{start:020}{SUFFIX}"))
}

/// Fsyncs a directory so that file creations, renames and removals in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })
}

/// Creates (or truncates) the segment starting at `start`, durably.
pub(crate) fn create(dir: &Path, start: u64) -> Result<File> {
    let p = path(dir, start);
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&p)
        .map_err(|source| Error::Io {
            path: p.clone(),
            source,
        })?;
    f.sync_all()
        .map_err(|source| Error::Io { path: p, source })?;
    sync_dir(dir)?;
    Ok(f)
}

/// The segments in `dir`, sorted by start LSN.
pub(crate) fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    list_numbered(dir, PREFIX, SUFFIX)
}

/// Files in `dir` named `<prefix><number><suffix>`, sorted by number.
pub(crate) fn list_numbered(dir: &Path, prefix: &str, suffix: &str) -> Result<Vec<(u64, PathBuf)>> {
    let io = |source| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut v = Vec::new();
    for e in fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(num) = name
            .strip_prefix(prefix)
            .and_then(|n| n.strip_suffix(suffix))
        {
            if let Ok(n) = num.parse::<u64>() {
                v.push((n, e.path()));
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
    /// Bytes dropped from a torn tail.
    pub torn_bytes: u64,
}

/// Reads every record with LSN >= `from`, in log order, calling `apply(lsn, record)`.
///
/// A partial record at the very end of the last segment is a torn tail (expected after a
/// crash): it is cut off (the file is truncated to the last whole record). Anything else that
/// fails to decode is corruption, reported with the file and offset.
pub(crate) fn replay(
    dir: &Path,
    from: u64,
    mut apply: impl FnMut(u64, LogRecord) -> Result<()>,
) -> Result<LogScan> {
    let segs = list(dir)?;
    let mut end = from;
    let mut torn_bytes = 0;
    for (i, (start, p)) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let next_start = segs.get(i + 1).map(|s| s.0);
        if next_start.is_some_and(|n| n <= from) {
            continue; // wholly before the checkpoint
        }
        let bytes = fs::read(p).map_err(|source| Error::Io {
            path: p.clone(),
            source,
        })?;
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
        while off < bytes.len() {
            let lsn = start + off as u64;
            match decode_frame(&bytes[off..]) {
                Frame::Record(rec, n) => {
                    if lsn >= from {
                        apply(lsn, rec)?;
                    }
                    off += n;
                }
                Frame::Truncated if last => {
                    torn_bytes = (bytes.len() - off) as u64;
                    truncate(p, off as u64)?;
                    break;
                }
                Frame::Bad(detail) if last && !has_good_record_after(&bytes, off) => {
                    // A torn tail can also leave a complete-looking frame of garbage (a
                    // partly written length). Nothing valid follows it, so cut it off.
                    let _ = detail;
                    torn_bytes = (bytes.len() - off) as u64;
                    truncate(p, off as u64)?;
                    break;
                }
                Frame::Truncated => {
                    return Err(Error::Corrupt {
                        path: p.clone(),
                        offset: off as u64,
                        detail: "a record is cut short in a segment that is not the last".into(),
                    })
                }
                Frame::Bad(detail) => {
                    return Err(Error::Corrupt {
                        path: p.clone(),
                        offset: off as u64,
                        detail,
                    })
                }
            }
        }
        end = start + off as u64;
        if let Some(n) = next_start {
            if n != end && !last {
                return Err(Error::Corrupt {
                    path: p.clone(),
                    offset: off as u64,
                    detail: format!("segment ends at LSN {end} but the next one starts at {n}"),
                });
            }
        }
    }
    Ok(LogScan {
        end: end.max(from),
        torn_bytes,
    })
}

/// True if some whole, checksummed record starts anywhere after `off` (then damage at `off`
/// is corruption of committed data, not a torn tail).
fn has_good_record_after(bytes: &[u8], off: usize) -> bool {
    (off + 1..bytes.len()).any(|o| matches!(decode_frame(&bytes[o..]), Frame::Record(..)))
}

fn truncate(p: &Path, len: u64) -> Result<()> {
    let io = |source| Error::Io {
        path: p.to_path_buf(),
        source,
    };
    let f = OpenOptions::new().write(true).open(p).map_err(io)?;
    f.set_len(len).map_err(io)?;
    f.sync_all().map_err(io)
}
