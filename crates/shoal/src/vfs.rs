//! The file operations of the engine, behind one small interface.
//!
//! Every byte the engine persists goes through a [`Vfs`]: directory creation and locking, file
//! creation, appends, writes in place, fsyncs, truncation, renames, removals and directory fsyncs, and the reads
//! of recovery. Production uses [`StdFs`] (plain `std::fs`; the log writes one buffer per group
//! commit, so a virtual call per write costs nothing measurable). The tests use an in-memory
//! file system (`vfs::mem`, test builds only) that can fail the N-th operation with `EIO` or
//! `ENOSPC` and simulate a power loss, in the manner of SQLite's crash-test VFS and RocksDB's
//! `FaultInjectionTestFS`.
//!
//! Errors name the operation and the file: an [`Error::Io`] whose path is the file and whose
//! message starts with the operation (`"fsync: ..."`).

use std::any::Any;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A file open for writing: appends at its end, or writes in place at an offset.
pub(crate) trait VFile: Send {
    /// Appends all of `buf`.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()>;
    /// Writes all of `buf` at byte `offset`, over what is there (or extending the file).
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes the file at least `len` bytes long by writing zeros after its end (real bytes,
    /// not a hole or an unwritten extent), so that once an fsync has made them durable, writes
    /// below `len` change no file metadata and an fdatasync of them flushes data only.
    fn allocate(&mut self, len: u64) -> io::Result<()>;
    /// Makes the file's contents durable (fdatasync).
    fn sync(&mut self) -> io::Result<()>;
    /// Cuts (or extends) the file to `len` bytes; durable only after [`sync`](Self::sync).
    fn set_len(&mut self, len: u64) -> io::Result<()>;
}

/// A held directory lock; dropping it unlocks.
pub(crate) type DirLock = Box<dyn Any + Send + Sync>;

/// The file system as the engine uses it.
pub(crate) trait Vfs: Send + Sync {
    /// Creates `dir` and its parents if missing, durably: each new directory's parent is
    /// synced once it names it.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Locks `dir` against every other opener (other handles and processes) until the guard
    /// is dropped; fails with [`io::ErrorKind::WouldBlock`] when it is locked already.
    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock>;
    /// Creates a new, empty file; fails with [`io::ErrorKind::AlreadyExists`] if `path`
    /// exists.
    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VFile>>;
    /// Opens an existing file for writing, positioned at its end (so
    /// [`VFile::write_all`] appends; not `O_APPEND`, which would make
    /// [`VFile::write_at`] append too).
    fn open_write(&self, path: &Path) -> io::Result<Box<dyn VFile>>;
    /// The whole contents of a file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The names of the entries of `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The canonical form of an existing path (to tell whether two paths are one directory).
    fn canonical(&self, path: &Path) -> io::Result<PathBuf>;
}

/// The production file system: `std::fs`.
pub(crate) struct StdFs;

struct StdFile(File);

impl VFile for StdFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }
    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::write_all_at(&self.0, buf, offset)
        }
        #[cfg(not(unix))]
        {
            use std::io::{Seek as _, SeekFrom};
            let back = self.0.stream_position()?;
            self.0.seek(SeekFrom::Start(offset))?;
            let res = self.0.write_all(buf);
            self.0.seek(SeekFrom::Start(back))?;
            res
        }
    }
    fn allocate(&mut self, len: u64) -> io::Result<()> {
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut at = self.0.metadata()?.len();
        while at < len {
            let n = (len - at).min(ZEROS.len() as u64) as usize;
            self.write_at(at, &ZEROS[..n])?;
            at += n as u64;
        }
        Ok(())
    }
    fn sync(&mut self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl Vfs for StdFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // The directories this creates, outermost first: each one's entry lives in its
        // parent, which is synced once it holds it, so that a power loss cannot take a new
        // database's directory, and the commits acknowledged in it, with it.
        let mut new: Vec<&Path> = dir
            .ancestors()
            .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
            .collect();
        new.reverse();
        fs::create_dir_all(dir)?;
        for d in new {
            let parent = match d.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            self.sync_dir(parent)?;
        }
        Ok(())
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        // The directory itself is locked (flock on its descriptor), so deleting a file in it
        // cannot unlock it. Elsewhere a `LOCK` file stands in.
        #[cfg(unix)]
        let f = File::open(dir)?;
        #[cfg(not(unix))]
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        match f.try_lock() {
            Ok(()) => Ok(Box::new(f)),
            Err(fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the database is open in another handle or process",
            )),
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VFile>> {
        let f = OpenOptions::new().write(true).create_new(true).open(path)?;
        Ok(Box::new(StdFile(f)))
    }

    fn open_write(&self, path: &Path) -> io::Result<Box<dyn VFile>> {
        use std::io::{Seek as _, SeekFrom};
        let mut f = OpenOptions::new().write(true).open(path)?;
        f.seek(SeekFrom::End(0))?;
        Ok(Box::new(StdFile(f)))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut v = Vec::new();
        for e in fs::read_dir(dir)? {
            if let Some(name) = e?.file_name().to_str() {
                v.push(name.to_string());
            }
        }
        Ok(v)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        fs::canonicalize(path)
    }
}

/// The default file system, shared.
pub(crate) fn std_fs() -> Arc<dyn Vfs> {
    Arc::new(StdFs)
}

/// An [`Error::Io`] for operation `op` on `path`: the message names both.
pub(crate) fn io_error(op: &str, path: &Path, e: io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: io::Error::new(e.kind(), format!("{op}: {e}")),
    }
}

/// `|e| io_error(op, path, e)`, for `map_err`.
pub(crate) fn on<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> Error + 'p {
    move |e| io_error(op, path, e)
}

/// A file being written sequentially through a [`Vfs`], with a write buffer.
pub(crate) struct BufFile {
    file: Box<dyn VFile>,
    path: PathBuf,
    buf: Vec<u8>,
    written: u64,
}

impl BufFile {
    /// Creates `path` (which must not exist).
    pub(crate) fn create(vfs: &dyn Vfs, path: &Path) -> Result<BufFile> {
        let file = vfs.create_new(path).map_err(on("create", path))?;
        Ok(BufFile {
            file,
            path: path.to_path_buf(),
            buf: Vec::with_capacity(1 << 20),
            written: 0,
        })
    }

    /// Bytes handed to [`write`](Self::write) so far.
    pub(crate) fn position(&self) -> u64 {
        self.written + self.buf.len() as u64
    }

    /// Appends `bytes`.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= 1 << 20 {
            self.drain()?;
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.file
                .write_all(&self.buf)
                .map_err(on("write", &self.path))?;
            self.written += self.buf.len() as u64;
            self.buf.clear();
        }
        Ok(())
    }

    /// Writes out the buffer and fsyncs.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.drain()?;
        self.file.sync().map_err(on("fsync", &self.path))
    }
}

#[cfg(test)]
pub(crate) mod mem;
