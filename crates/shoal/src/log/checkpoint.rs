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

use std::path::{Path, PathBuf};

use super::record::{decode_frame_at, place_frame, Frame, LogRecord, Write};
use super::segment::sync_dir;
use crate::error::{Error, Result};
use crate::vfs::{on, BufFile, Vfs};

const PREFIX: &str = "checkpoint-";
const SUFFIX: &str = ".ckpt";
const TMP: &str = ".tmp";

fn path(dir: &Path, lsn: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{lsn:020}{SUFFIX}"))
}

/// Lists complete checkpoint files, sorted by LSN.
pub(crate) fn list(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    super::segment::list_numbered(vfs, dir, PREFIX, SUFFIX)
}

/// Removes the temporary files of checkpoints that never completed (a crash or an error
/// while one was written): they were never renamed, so nothing refers to them.
pub(crate) fn remove_unfinished(vfs: &dyn Vfs, dir: &Path) -> Result<usize> {
    let tmps = super::segment::list_numbered(vfs, dir, PREFIX, TMP)?;
    for (_, p) in &tmps {
        vfs.remove(p).map_err(on("remove", p))?;
    }
    if !tmps.is_empty() {
        sync_dir(vfs, dir)?;
    }
    Ok(tmps.len())
}

/// Writes a checkpoint covering the log below `lsn`, record by record; the caller passes
/// committed data only. Dropped before [`finish`](Self::finish), it removes its temporary
/// file.
pub(crate) struct CheckpointWriter<'v> {
    vfs: &'v dyn Vfs,
    dir: PathBuf,
    lsn: u64,
    tmp: PathBuf,
    out: Option<BufFile>,
    records: u64,
    buf: Vec<u8>,
}

impl<'v> CheckpointWriter<'v> {
    pub fn create(vfs: &'v dyn Vfs, dir: &Path, lsn: u64) -> Result<Self> {
        let tmp = dir.join(format!("{PREFIX}{lsn:020}{TMP}"));
        // A leftover of an earlier attempt at the same LSN.
        let _ = vfs.remove(&tmp);
        let out = BufFile::create(vfs, &tmp)?;
        Ok(CheckpointWriter {
            vfs,
            dir: dir.to_path_buf(),
            lsn,
            tmp,
            out: Some(out),
            records: 0,
            buf: Vec::new(),
        })
    }

    pub fn record(&mut self, rec: &LogRecord) -> Result<()> {
        let out = self.out.as_mut().ok_or_else(|| Error::Io {
            path: self.tmp.clone(),
            source: std::io::Error::other("checkpoint writer already finished"),
        })?;
        self.buf.clear();
        rec.encode_into(&mut self.buf);
        if self.buf.len() - super::record::FRAME_HEADER > super::record::MAX_PAYLOAD {
            return Err(Error::Unsupported(format!(
                "a checkpoint record of {} bytes exceeds the log's limit of {} bytes",
                self.buf.len(),
                super::record::MAX_PAYLOAD
            )));
        }
        // Frames are salted with their offset in the file.
        place_frame(&mut self.buf, 0, out.position());
        self.records += 1;
        out.write(&self.buf)
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

    /// Completes the file durably, reads it back whole (a checkpoint must be known readable
    /// before anything it replaces is deleted), then removes older checkpoints; returns the
    /// path.
    pub fn finish(mut self) -> Result<PathBuf> {
        let end = LogRecord::CheckpointEnd {
            lsn: self.lsn,
            records: self.records,
        };
        self.record(&end)?;
        let vfs = self.vfs;
        if let Some(out) = self.out.as_mut() {
            out.sync()?;
        }
        let fin = path(&self.dir, self.lsn);
        // On failure, drop removes the temporary file.
        vfs.rename(&self.tmp, &fin)
            .map_err(on("rename", &self.tmp))?;
        self.out = None;
        sync_dir(vfs, &self.dir)?;
        if let Err(e) = read(vfs, &fin, self.lsn, |_| Ok(())) {
            // Unreadable: never let it stand in for the log.
            let _ = vfs.remove(&fin);
            let _ = sync_dir(vfs, &self.dir);
            return Err(e);
        }
        for (l, p) in list(vfs, &self.dir)? {
            if l < self.lsn {
                vfs.remove(&p).map_err(on("remove", &p))?;
            }
        }
        Ok(fin)
    }
}

impl Drop for CheckpointWriter<'_> {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            // Not finished: the partial file must not linger (it fills a disk that is full
            // already, and nothing will ever read it).
            let _ = self.vfs.remove(&self.tmp);
        }
    }
}

/// Decodes the checkpoint file `p` of LSN `lsn` record by record, calling `f` on every record
/// before the end marker, and checks the marker.
fn read(
    vfs: &dyn Vfs,
    p: &Path,
    lsn: u64,
    mut f: impl FnMut(LogRecord) -> Result<()>,
) -> Result<()> {
    let bytes = vfs.read(p).map_err(on("read", p))?;
    let corrupt = |offset: usize, detail: String| Error::Corrupt {
        path: p.to_path_buf(),
        offset: offset as u64,
        detail,
    };
    let mut off = 0;
    let mut records = 0u64;
    loop {
        match decode_frame_at(&bytes[off..], off as u64) {
            Frame::Record(LogRecord::CheckpointEnd { lsn: l, records: n }, len) => {
                if l != lsn || n != records || off + len != bytes.len() {
                    return Err(corrupt(
                        off,
                        "checkpoint end marker does not match the file".into(),
                    ));
                }
                return Ok(());
            }
            Frame::Record(r, len) => {
                records += 1;
                f(r)?;
                off += len;
            }
            Frame::Truncated => return Err(corrupt(off, "checkpoint file is incomplete".into())),
            Frame::Bad(detail) => return Err(corrupt(off, detail)),
        }
    }
}

/// A loaded checkpoint.
pub(crate) struct Loaded {
    pub lsn: u64,
    pub records: Vec<LogRecord>,
}

/// Loads the newest checkpoint, if any. A damaged checkpoint is an error naming the file:
/// older log segments may already be gone, so falling back could lose committed data.
pub(crate) fn load_latest(vfs: &dyn Vfs, dir: &Path) -> Result<Option<Loaded>> {
    let Some((lsn, p)) = list(vfs, dir)?.pop() else {
        return Ok(None);
    };
    let mut records = Vec::new();
    read(vfs, &p, lsn, |r| {
        records.push(r);
        Ok(())
    })?;
    Ok(Some(Loaded { lsn, records }))
}
