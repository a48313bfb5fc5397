//! Checkpoint files: `checkpoint-<LSN, 20 digits>.ckpt`, a snapshot of every table that,
//! together with the log from LSN on, rebuilds the database.
//!
//! A checkpoint is fuzzy: transactions keep running while it is taken. The snapshot reads each
//! key under an instant shared key lock, so it sees only committed values; every commit not
//! reflected in it has a commit record at or after the checkpoint LSN, and replaying
//! after-images is idempotent. The file is written as `.tmp`, fsynced, renamed, and the
//! directory fsynced; only then are older checkpoints and log segments deleted.
//!
//! Layout: framed [`LogRecord`]s — one `CreateTable` per table, `Commit` records (txn 0)
//! carrying the rows in chunks, and a final `CheckpointEnd` whose record count proves the
//! file complete.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use super::record::{decode_frame, Frame, LogRecord, Write};
use super::segment::sync_dir;
use crate::error::{Error, Result};

const PREFIX: &str = "checkpoint-";
const SUFFIX: &str = ".ckpt";

fn path(dir: &Path, lsn: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{lsn:020}{SUFFIX}"))
}

/// Lists complete checkpoint files, sorted by LSN.
pub(crate) fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    super::segment::list_numbered(dir, PREFIX, SUFFIX)
}

/// Writes a checkpoint covering the log below `lsn`. `rows` yields, per table, chunks of
/// rows; it is called once and must produce committed data only.
pub(crate) struct CheckpointWriter {
    dir: PathBuf,
    lsn: u64,
    tmp: PathBuf,
    out: BufWriter<File>,
    records: u64,
    buf: Vec<u8>,
}

impl CheckpointWriter {
    pub fn create(dir: &Path, lsn: u64) -> Result<Self> {
        let tmp = dir.join(format!("{PREFIX}{lsn:020}.tmp"));
        let f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|source| Error::Io {
                path: tmp.clone(),
                source,
            })?;
        Ok(CheckpointWriter {
            dir: dir.to_path_buf(),
            lsn,
            tmp,
            out: BufWriter::with_capacity(1 << 20, f),
            records: 0,
            buf: Vec::new(),
        })
    }

    pub fn record(&mut self, rec: &LogRecord) -> Result<()> {
        self.buf.clear();
        rec.encode_into(&mut self.buf);
        self.records += 1;
        self.out.write_all(&self.buf).map_err(|source| Error::Io {
            path: self.tmp.clone(),
            source,
        })
    }

    pub fn table(&mut self, id: u32, name: &str) -> Result<()> {
        self.record(&LogRecord::CreateTable {
            id,
            name: name.to_string(),
        })
    }

    pub fn rows(&mut self, writes: Vec<Write>) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        self.record(&LogRecord::Commit { txn: 0, writes })
    }

    /// Completes the file durably and removes older checkpoints; returns the path.
    pub fn finish(mut self) -> Result<PathBuf> {
        let end = LogRecord::CheckpointEnd {
            lsn: self.lsn,
            records: self.records,
        };
        self.record(&end)?;
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| Error::Io { path: p, source }
        };
        let f = self.out.into_inner().map_err(|e| Error::Io {
            path: self.tmp.clone(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(io(&self.tmp))?;
        drop(f);
        let fin = path(&self.dir, self.lsn);
        fs::rename(&self.tmp, &fin).map_err(io(&fin))?;
        sync_dir(&self.dir)?;
        for (l, p) in list(&self.dir)? {
            if l < self.lsn {
                fs::remove_file(&p).map_err(io(&p))?;
            }
        }
        Ok(fin)
    }
}

/// A loaded checkpoint.
pub(crate) struct Loaded {
    pub lsn: u64,
    pub records: Vec<LogRecord>,
}

/// Loads the newest checkpoint, if any. A damaged checkpoint is an error naming the file:
/// older log segments may already be gone, so falling back could lose committed data.
pub(crate) fn load_latest(dir: &Path) -> Result<Option<Loaded>> {
    let Some((lsn, p)) = list(dir)?.pop() else {
        return Ok(None);
    };
    let bytes = fs::read(&p).map_err(|source| Error::Io {
        path: p.clone(),
        source,
    })?;
    let mut off = 0;
    let mut records = Vec::new();
    loop {
        match decode_frame(&bytes[off..]) {
            Frame::Record(LogRecord::CheckpointEnd { lsn: l, records: n }, len) => {
                if l != lsn || n != records.len() as u64 || off + len != bytes.len() {
                    return Err(Error::Corrupt {
                        path: p,
                        offset: off as u64,
                        detail: "checkpoint end marker does not match the file".into(),
                    });
                }
                return Ok(Some(Loaded { lsn, records }));
            }
            Frame::Record(r, len) => {
                records.push(r);
                off += len;
            }
            Frame::Truncated => {
                return Err(Error::Corrupt {
                    path: p,
                    offset: off as u64,
                    detail: "checkpoint file is incomplete".into(),
                })
            }
            Frame::Bad(detail) => {
                return Err(Error::Corrupt {
                    path: p,
                    offset: off as u64,
                    detail,
                })
            }
        }
    }
}
