//! One directory, one owner: the `SHOAL-ID` file that ties a log directory to its database.
//!
//! A database directory holds `SHOAL-ID`, a random identity written when it is first opened.
//! When the log lives in another directory ([`Options::log_dir`](crate::Options::log_dir)),
//! that directory holds a copy, and opening refuses a log directory whose identity differs:
//! two databases can never replay (and then interleave) one log.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use crate::error::{Error, Result};
use crate::log::segment::sync_dir;
use crate::vfs::{on, Vfs};

const FILE: &str = "SHOAL-ID";
const HEAD: &str = "shoal database ";

/// Makes sure `dir` has an identity and that `log_dir`, if separate, has the same one.
pub(super) fn claim(vfs: &dyn Vfs, dir: &Path, log_dir: Option<&Path>) -> Result<()> {
    let id = match read(vfs, dir)? {
        Some(id) => id,
        None => {
            let id = fresh();
            write(vfs, dir, &id)?;
            id
        }
    };
    let Some(log_dir) = log_dir else {
        return Ok(());
    };
    match read(vfs, log_dir)? {
        Some(other) if other == id => Ok(()),
        Some(other) => Err(Error::InvalidOptions(format!(
            "the log directory {} belongs to another database (its {FILE} says {other}, the \
             database directory {} says {id}): give each database its own log directory",
            log_dir.display(),
            dir.display()
        ))),
        None => write(vfs, log_dir, &id),
    }
}

fn read(vfs: &dyn Vfs, dir: &Path) -> Result<Option<String>> {
    let p = dir.join(FILE);
    let bytes = match vfs.read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(crate::vfs::io_error("read", &p, e)),
    };
    let id = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|t| t.strip_prefix(HEAD))
        .and_then(|t| t.strip_suffix('\n'))
        .filter(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    match id {
        Some(id) => Ok(Some(id.to_string())),
        None => Err(Error::Corrupt {
            path: p,
            offset: 0,
            detail: format!("not a shoal identity file (expected \"{HEAD}<32 hex digits>\")"),
        }),
    }
}

/// Writes the identity durably: a temporary file, fsynced, renamed, directory fsynced.
fn write(vfs: &dyn Vfs, dir: &Path, id: &str) -> Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    let fin = dir.join(FILE);
    let _ = vfs.remove(&tmp);
    let mut f = vfs.create_new(&tmp).map_err(on("create", &tmp))?;
    f.write_all(format!("{HEAD}{id}\n").as_bytes())
        .map_err(on("write", &tmp))?;
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
