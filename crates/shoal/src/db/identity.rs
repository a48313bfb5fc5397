//! One directory, one owner: the `SHOAL-ID` file that ties a log directory to its database.
//!
//! A database directory holds `SHOAL-ID`, a random identity written when it is first opened.
//! When the log lives in another directory ([`Options::log_dir`](crate::Options::log_dir)),
//! that directory holds a copy, and opening refuses a log directory whose identity differs:
//! two databases can never replay (and then interleave) one log. The database directory
//! then also holds `LOG-ELSEWHERE`, naming the log directory: an open without
//! [`Options::log_dir`](crate::Options::log_dir) is refused rather than finding no log and
//! opening an empty database, and so is an open that names a separate log directory while
//! the log is in the database directory. The log directory holds `LOG-OF`, naming the
//! database directory: opening the log directory as a database of its own is refused (it
//! replayed the other database's log, appended to it, and its first checkpoint deleted the
//! other's segments).
//!
//! The file also carries the on-disk format ([`FORMAT`]), so that a build never reads a log
//! it would misread.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::log::segment::sync_dir;
use crate::vfs::{on, Vfs};

const FILE: &str = "SHOAL-ID";
/// In a database directory whose log lives elsewhere: names that directory. Without it,
/// an open that forgot [`Options::log_dir`](crate::Options::log_dir) found no log in the
/// database directory and opened an empty database, which then began a second log there.
const ELSEWHERE: &str = "LOG-ELSEWHERE";
/// In a separate log directory: names the database directory it serves.
const LOG_OF: &str = "LOG-OF";
const HEAD: &str = "shoal database ";
const FORMAT_HEAD: &str = "format ";

/// The on-disk format this build writes, stamped in `SHOAL-ID` under the identity:
///
/// - 1 (no format line): log frames without flush marks, no `Close` record;
/// - 2: the first frame of each flush of the log is marked (the top bit of its length) and
///   a clean close ends the log with a `Close` record.
///
/// This build reads both, and stamps 2 on a database of format 1 when it opens it: from then
/// on it writes marked frames, which a build that knows only format 1 would read as a torn
/// tail and cut. Such a build refuses the stamp (it expects the identity line alone), so it
/// cannot open the database at all. A stamp above [`FORMAT`] is refused the same way here.
pub(crate) const FORMAT: u32 = 2;

/// What a `SHOAL-ID` file says.
#[derive(Debug, PartialEq, Eq)]
struct Stamp {
    id: String,
    format: u32,
}

/// What [`claim`] found to write: the identity, the directories whose `SHOAL-ID` is missing
/// or of an older format, and the separate log directory to name in the database
/// directory's [`ELSEWHERE`] when it is not named there yet.
#[must_use = "the stamps are written only by `stamp`"]
pub(super) struct Claim {
    id: String,
    dir: PathBuf,
    stale: Vec<PathBuf>,
    elsewhere: Option<PathBuf>,
    /// The separate log directory, when its [`LOG_OF`] marker is missing.
    log_of: Option<PathBuf>,
}

impl Claim {
    /// Writes the identity, stamped with this build's [`FORMAT`], where it is missing or
    /// older, and the marker. Called once the database has been recovered, so an open that
    /// fails (a newer format, damage) changes nothing on disk.
    pub(super) fn stamp(self, vfs: &dyn Vfs) -> Result<()> {
        // The database directory's identity goes first (`stale` lists it first), then the
        // log directory's, then the marker: a marker only ever names a log directory that
        // carries the identity, and an open that stops in between leaves a database that
        // opens. (The log directory's first, an open that failed before the database
        // directory's left a log directory that claimed a database whose directory said
        // nothing, and every later open was refused as "another database's" log.)
        let text = format!("{HEAD}{}\n{FORMAT_HEAD}{FORMAT}\n", self.id);
        for d in &self.stale {
            write(vfs, d, FILE, &text)?;
        }
        if let Some(l) = &self.elsewhere {
            write(vfs, &self.dir, ELSEWHERE, &format!("{}\n", l.display()))?;
        }
        match &self.log_of {
            Some(l) => write(vfs, l, LOG_OF, &format!("{}\n", self.dir.display())),
            None => Ok(()),
        }
    }
}

/// Checks that `dir`'s identity, if any, and `log_dir`'s, if separate, are the same and in a
/// format this build reads, and that the log is where it was; returns what to write once
/// the database has opened.
pub(super) fn claim(vfs: &dyn Vfs, dir: &Path, log_dir: Option<&Path>) -> Result<Claim> {
    if let Some(db) = marker(vfs, dir, LOG_OF)? {
        return Err(Error::InvalidOptions(format!(
            "{} is the log directory of the database in {db} (says {}): open that database \
             with `Options::log_dir` naming this directory",
            dir.display(),
            dir.join(LOG_OF).display()
        )));
    }
    let own = read(vfs, dir)?;
    let log = match log_dir {
        Some(l) => read(vfs, l)?,
        None => None,
    };
    if let (Some(log), Some(log_dir)) = (&log, log_dir) {
        if own.as_ref().map(|s| &s.id) != Some(&log.id) {
            return Err(Error::InvalidOptions(format!(
                "the log directory {} belongs to another database (its {FILE} says {}, the \
                 database directory {} says {}): give each database its own log directory",
                log_dir.display(),
                log.id,
                dir.display(),
                own.as_ref().map_or("nothing yet", |s| s.id.as_str())
            )));
        }
    }
    let marker_path = dir.join(ELSEWHERE);
    let elsewhere = marker(vfs, dir, ELSEWHERE)?;
    match (&elsewhere, log_dir) {
        (Some(l), None) => {
            return Err(Error::InvalidOptions(format!(
                "the database in {} keeps its log in another directory ({l}, says {}): open \
                 it with `Options::log_dir` naming that directory (to keep the log in the \
                 database directory again, move its log-*.seg files there and remove {0})",
                dir.display(),
                marker_path.display()
            )))
        }
        (Some(l), Some(log_dir)) if log.is_none() => {
            return Err(Error::InvalidOptions(format!(
                "the log directory {} has no {FILE}, but the database in {} keeps its log in \
                 {l}: give that directory (or a copy of it)",
                log_dir.display(),
                dir.display()
            )))
        }
        (None, Some(log_dir)) if !crate::log::segment::list(vfs, dir)?.is_empty() => {
            return Err(Error::InvalidOptions(format!(
                "the database directory {} holds the database's log (log-*.seg files), and \
                 `Options::log_dir` names {}: open it without a separate log directory, or \
                 move the log there first",
                dir.display(),
                log_dir.display()
            )))
        }
        _ => {}
    }
    let id = own.as_ref().map_or_else(fresh, |s| s.id.clone());
    let stale = |found: &Option<Stamp>| found.as_ref().is_none_or(|s| s.format != FORMAT);
    let mut dirs = Vec::new();
    if stale(&own) {
        dirs.push(dir.to_path_buf());
    }
    if let Some(l) = log_dir.filter(|_| stale(&log)) {
        dirs.push(l.to_path_buf());
    }
    let log_of = match log_dir {
        Some(l) if marker(vfs, l, LOG_OF)?.is_none() => Some(l.to_path_buf()),
        _ => None,
    };
    Ok(Claim {
        id,
        dir: dir.to_path_buf(),
        stale: dirs,
        elsewhere: log_dir
            .filter(|_| elsewhere.is_none())
            .map(Path::to_path_buf),
        log_of,
    })
}

/// The text of marker file `name` in `dir` (its first line), if it is there.
fn marker(vfs: &dyn Vfs, dir: &Path, name: &str) -> Result<Option<String>> {
    let p = dir.join(name);
    match vfs.read(&p) {
        Ok(b) => Ok(Some(String::from_utf8_lossy(&b).trim_end().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(crate::vfs::io_error("read", &p, e)),
    }
}

fn read(vfs: &dyn Vfs, dir: &Path) -> Result<Option<Stamp>> {
    let p = dir.join(FILE);
    let bytes = match vfs.read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(crate::vfs::io_error("read", &p, e)),
    };
    let Some(stamp) = std::str::from_utf8(&bytes).ok().and_then(parse) else {
        return Err(Error::Corrupt {
            path: p,
            offset: 0,
            detail: format!(
                "not a shoal identity file (expected \"{HEAD}<32 hex digits>\", then \
                 optionally \"{FORMAT_HEAD}<number>\")"
            ),
        });
    };
    if stamp.format > FORMAT {
        return Err(Error::Unsupported(format!(
            "{} says the database is in on-disk format {}, and this build of shoal reads \
             formats 1 to {FORMAT}: a newer build wrote it (open it with that one), or the file \
             is damaged",
            p.display(),
            stamp.format
        )));
    }
    Ok(Some(stamp))
}

/// Parses the identity line and the optional format line (format 1 when absent).
fn parse(text: &str) -> Option<Stamp> {
    let mut lines = text.strip_suffix('\n')?.split('\n');
    let id = lines
        .next()?
        .strip_prefix(HEAD)
        .filter(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))?;
    let format = match lines.next() {
        None => 1,
        Some(l) => l
            .strip_prefix(FORMAT_HEAD)?
            .parse::<u32>()
            .ok()
            .filter(|&f| f >= 1)?,
    };
    if lines.next().is_some() {
        return None;
    }
    Some(Stamp {
        id: id.to_string(),
        format,
    })
}

/// Writes `text` to `dir/name` durably: a temporary file, fsynced, renamed, directory
/// fsynced.
fn write(vfs: &dyn Vfs, dir: &Path, name: &str, text: &str) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let fin = dir.join(name);
    let _ = vfs.remove(&tmp);
    let mut f = vfs.create_new(&tmp).map_err(on("create", &tmp))?;
    f.write_all(text.as_bytes()).map_err(on("write", &tmp))?;
    f.sync().map_err(on("fsync", &tmp))?;
    drop(f);
    vfs.rename(&tmp, &fin).map_err(on("rename", &tmp))?;
    sync_dir(vfs, dir)
}

/// 128 random bits as hex (the standard library's per-process random hash keys, the time and
/// the process id).
fn fresh() -> String {
    let mut out = String::new();
    for i in 0..2u64 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}
