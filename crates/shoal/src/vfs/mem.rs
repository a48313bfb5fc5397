//! An in-memory file system for tests, with fault injection and power loss.
//!
//! Every file is an inode with its current bytes and the bytes its last completed fsync made
//! durable; every directory has its current entries and the entries its last completed
//! directory fsync made durable. [`MemFs::power_loss`] builds the file system a machine would
//! find after losing power now: each directory as of its last fsync, each file as of its last
//! fsync plus, at 512-byte granularity, some of what was written (appended, or written in
//! place) after it (a torn write): a random prefix, or a random subset of its sectors
//! ([`Tear`]). Creations, renames and removals not made durable by a directory fsync are
//! undone.
//!
//! [`MemFs::fail_at`] makes the N-th mutating operation (create, write, fsync, truncate,
//! rename, remove, directory fsync; counted from 0) fail with `EIO` or `ENOSPC`, once or from
//! then on. A failing `ENOSPC` write stores half its bytes first, as a full disk may.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{DirLock, VFile, Vfs};

/// How a power loss tears what was written since the last fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tear {
    /// Writes reach the disk in order, whole sectors at a time: a prefix of them survives
    /// (the last sector it keeps maybe only in part), the rest is as synced. An unsynced
    /// truncation is undone.
    Prefix,
    /// Each changed 512-byte sector survives or not independently, as a disk with a write
    /// cache and no ordering between the sectors of unsynced writes may leave it; the
    /// file's size is its current or its synced one.
    Scattered,
}

/// The error an injected fault raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// `EIO`.
    Eio,
    /// `ENOSPC`.
    NoSpace,
}

impl Fault {
    fn error(self) -> io::Error {
        io::Error::from_raw_os_error(match self {
            Fault::Eio => 5,
            Fault::NoSpace => 28,
        })
    }
}

#[derive(Clone, Default)]
struct Inode {
    data: Vec<u8>,
    synced: Vec<u8>,
    /// Bytes a failed fsync dropped, as Linux does: it marks the dirty pages clean without
    /// writing them, so reads still see the bytes but no later fsync makes them durable
    /// until they are written again ("fsyncgate"). Empty: none.
    dropped: Vec<bool>,
}

impl Inode {
    /// The bytes the disk can come to hold: the file's, but those a failed fsync dropped
    /// as they were synced (zeros past the synced length).
    fn reachable(&self) -> Vec<u8> {
        let mut out = self.data.clone();
        for (k, b) in out.iter_mut().enumerate() {
            if self.dropped.get(k).copied().unwrap_or(false) {
                *b = self.synced.get(k).copied().unwrap_or(0);
            }
        }
        out
    }
}

#[derive(Clone, Default)]
struct Dir {
    live: BTreeMap<String, usize>,
    durable: BTreeMap<String, usize>,
}

#[derive(Default)]
struct State {
    inodes: Vec<Inode>,
    dirs: BTreeMap<PathBuf, Dir>,
    locks: HashSet<PathBuf>,
    ops: u64,
    fail: Option<(u64, Fault, bool)>,
    injected: Option<String>,
    /// Every injected failure, in order.
    all_injected: Vec<String>,
    /// Reading operations so far (`read`, `list`, `open_write`, `lock_dir`).
    reads: u64,
    /// The reading operation to fail with `EIO`, if any.
    fail_read: Option<u64>,
    /// Creations of files whose name starts with this fail with `ENOSPC` (no inodes left).
    fail_creates: Option<String>,
}

impl State {
    /// Records an injected failure (`op file`).
    fn note(&mut self, what: String) {
        if self.injected.is_none() {
            self.injected = Some(what.clone());
        }
        self.all_injected.push(what);
    }

    /// Counts a mutating operation and fails it if it is the chosen one.
    fn check(&mut self, op: &str, path: &Path) -> io::Result<()> {
        let n = self.ops;
        self.ops += 1;
        match self.fail {
            // A full disk still removes files (removing frees space).
            Some((_, Fault::NoSpace, _)) if op == "remove" => Ok(()),
            Some((at, fault, sticky)) if n == at || (sticky && n > at) => {
                self.note(format!("{op} {}", path.display()));
                Err(fault.error())
            }
            _ => Ok(()),
        }
    }

    /// Counts a reading operation and fails it (`EIO`) if it is the chosen one.
    fn check_read(&mut self, op: &str, path: &Path) -> io::Result<()> {
        let n = self.reads;
        self.reads += 1;
        if self.fail_read == Some(n) {
            self.note(format!("{op} {}", path.display()));
            return Err(Fault::Eio.error());
        }
        Ok(())
    }

    fn fault(&self) -> Option<Fault> {
        self.fail.map(|f| f.1)
    }

    fn split(path: &Path) -> io::Result<(PathBuf, String)> {
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        Ok((parent, name.to_string()))
    }

    fn dir(&mut self, dir: &Path) -> io::Result<&mut Dir> {
        self.dirs
            .get_mut(dir)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn lookup(&mut self, path: &Path) -> io::Result<usize> {
        let (parent, name) = Self::split(path)?;
        self.dir(&parent)?
            .live
            .get(&name)
            .copied()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
}

/// An in-memory file system shared by its clones.
#[derive(Clone, Default)]
pub(crate) struct MemFs {
    st: Arc<Mutex<State>>,
}

impl MemFs {
    /// An empty file system.
    pub(crate) fn new() -> MemFs {
        MemFs::default()
    }

    /// Fails mutating operation number `n` (from 0) with `fault`; with `sticky`, every later
    /// one too (a disk that stays full or broken).
    pub(crate) fn fail_at(&self, n: u64, fault: Fault, sticky: bool) {
        self.st.lock().fail = Some((n, fault, sticky));
    }

    /// Fails every later creation of a file whose name starts with `prefix` with `ENOSPC`
    /// (a file system out of inodes: writes to existing files still go through).
    pub(crate) fn fail_creates(&self, prefix: &str) {
        self.st.lock().fail_creates = Some(prefix.to_string());
    }

    /// Mutating operations so far.
    pub(crate) fn ops(&self) -> u64 {
        self.st.lock().ops
    }

    /// Fails reading operation number `n` (from 0; `read`, `list`, `open_write` and
    /// `lock_dir` count) with `EIO`, once: a disk that cannot read a sector.
    pub(crate) fn fail_read_at(&self, n: u64) {
        self.st.lock().fail_read = Some(n);
    }

    /// Reading operations so far.
    pub(crate) fn reads(&self) -> u64 {
        self.st.lock().reads
    }

    /// The operation and file of every injected failure, in order.
    pub(crate) fn all_injected(&self) -> Vec<String> {
        self.st.lock().all_injected.clone()
    }

    /// The operation and file of the first injected failure, if one happened.
    pub(crate) fn injected(&self) -> Option<String> {
        self.st.lock().injected.clone()
    }

    /// The file system after a power loss now: [`Tear::Prefix`] for even seeds,
    /// [`Tear::Scattered`] for odd ones; `seed` also picks what survives.
    pub(crate) fn power_loss(&self, seed: u64) -> MemFs {
        let tear = if seed.is_multiple_of(2) {
            Tear::Prefix
        } else {
            Tear::Scattered
        };
        self.power_loss_with(seed, tear)
    }

    /// The file system after a power loss now, torn as `tear` says; `seed` picks what of
    /// each file's unsynced writes survives (whole 512-byte sectors).
    pub(crate) fn power_loss_with(&self, seed: u64, tear: Tear) -> MemFs {
        // splitmix64 of the seed: a plain multiple started every small seed's xorshift on
        // an odd first draw, so seeds 0 to 6 mostly kept a one-sector change whole.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let mut rng = (z ^ (z >> 31)) | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        self.derive(true, |i| {
            // What a failed fsync dropped never reaches the disk.
            let kept = i.reachable();
            let i = &Inode {
                data: kept,
                synced: i.synced.clone(),
                dropped: Vec::new(),
            };
            // The first byte written since the last fsync; nothing changed: the synced bytes.
            let n = i.data.len().max(i.synced.len());
            let Some(p) = (0..n).find(|&k| i.data.get(k) != i.synced.get(k)) else {
                return i.synced.clone();
            };
            // Cut points: that byte, every sector boundary after it, the end.
            let first = p.div_ceil(512) * 512;
            let mut cuts = vec![p.min(i.data.len())];
            cuts.extend((first..i.data.len()).step_by(512).filter(|&c| c > p));
            cuts.push(i.data.len());
            let c = cuts[(next() % cuts.len() as u64) as usize];
            match tear {
                Tear::Prefix => {
                    // What lies before the cut is new, what lies after it is as synced.
                    let mut out = i.data[..c].to_vec();
                    if i.synced.len() > c {
                        out.extend_from_slice(&i.synced[c..]);
                    }
                    out
                }
                Tear::Scattered => {
                    // The file is as long as it is now, or as it was synced (an unsynced
                    // change of size survives or not); each changed sector is new or as
                    // synced (zeros where the synced file was shorter), independently.
                    let len = if next() % 2 == 0 {
                        i.data.len()
                    } else {
                        i.synced.len()
                    };
                    let old = |k: usize| i.synced.get(k).copied().unwrap_or(0);
                    let new = |k: usize| i.data.get(k).copied().unwrap_or(0);
                    let mut out: Vec<u8> = (0..len).map(old).collect();
                    let mut s = p / 512 * 512;
                    while s < len {
                        if next() % 2 == 0 {
                            for (k, b) in out.iter_mut().enumerate().take(len.min(s + 512)).skip(s)
                            {
                                *b = new(k);
                            }
                        }
                        s += 512;
                    }
                    out
                }
            }
        })
    }

    /// A copy of the current state (no faults, no locks), as if every file were durable: what
    /// a process crash leaves (the kernel writes the page cache out), except the bytes a
    /// failed fsync dropped: the next process reads them, but they stay off the disk.
    pub(crate) fn snapshot(&self) -> MemFs {
        let out = self.derive(false, |i| i.data.clone());
        {
            let st = self.st.lock();
            let mut o = out.st.lock();
            for (mine, theirs) in st.inodes.iter().zip(o.inodes.iter_mut()) {
                if mine.dropped.iter().any(|&d| d) {
                    theirs.synced = mine.reachable();
                    theirs.dropped.clone_from(&mine.dropped);
                }
            }
        }
        out
    }

    /// A new file system whose files hold `bytes(inode)`, durably, and whose directories hold
    /// their durable entries (`durable_dirs`) or their current ones.
    fn derive(&self, durable_dirs: bool, mut bytes: impl FnMut(&Inode) -> Vec<u8>) -> MemFs {
        let st = self.st.lock();
        let inodes = st
            .inodes
            .iter()
            .map(|i| {
                let data = bytes(i);
                Inode {
                    synced: data.clone(),
                    data,
                    dropped: Vec::new(),
                }
            })
            .collect();
        let dirs = st
            .dirs
            .iter()
            .map(|(p, d)| {
                let entries = if durable_dirs { &d.durable } else { &d.live };
                (
                    p.clone(),
                    Dir {
                        live: entries.clone(),
                        durable: entries.clone(),
                    },
                )
            })
            .collect();
        MemFs {
            st: Arc::new(Mutex::new(State {
                inodes,
                dirs,
                ..State::default()
            })),
        }
    }

    /// The current bytes of every file, by path.
    pub(crate) fn files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let st = self.st.lock();
        let mut out = BTreeMap::new();
        for (p, d) in &st.dirs {
            for (name, &ino) in &d.live {
                out.insert(p.join(name), st.inodes[ino].data.clone());
            }
        }
        out
    }

    /// Replaces the bytes of an existing file (durably), for corruption tests.
    pub(crate) fn overwrite(&self, path: &Path, bytes: Vec<u8>) {
        let mut st = self.st.lock();
        let ino = st.lookup(path).expect("overwrite: no such file");
        st.inodes[ino] = Inode {
            synced: bytes.clone(),
            data: bytes,
            dropped: Vec::new(),
        };
    }
}

struct MemFile {
    st: Arc<Mutex<State>>,
    ino: usize,
    path: PathBuf,
}

impl VFile for MemFile {
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let end = self.st.lock().inodes[self.ino].data.len() as u64;
        self.write_at(end, buf)
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut st = self.st.lock();
        let res = st.check("write", &self.path);
        let n = match &res {
            Ok(()) => buf.len(),
            Err(_) if st.fault() == Some(Fault::NoSpace) => buf.len() / 2,
            Err(_) => 0,
        };
        let data = &mut st.inodes[self.ino].data;
        let at = offset as usize;
        if n > 0 && data.len() < at + n {
            data.resize(at + n, 0);
        }
        let from = at.min(data.len());
        data[from..][..n].copy_from_slice(&buf[..n]);
        // Written again: dirty again, and the next fsync writes them.
        let dropped = &mut st.inodes[self.ino].dropped;
        let to = (from + n).min(dropped.len());
        if from < to {
            dropped[from..to].fill(false);
        }
        res
    }

    fn allocate(&mut self, len: u64) -> io::Result<()> {
        let mut st = self.st.lock();
        let res = st.check("write", &self.path);
        let full = res.is_err() && st.fault() == Some(Fault::NoSpace);
        let data = &mut st.inodes[self.ino].data;
        let want = len as usize;
        if data.len() < want && (res.is_ok() || full) {
            // A full disk takes half of the zeros first.
            let to = if full {
                data.len() + (want - data.len()) / 2
            } else {
                want
            };
            data.resize(to, 0);
        }
        res
    }

    fn sync(&mut self) -> io::Result<()> {
        let mut st = self.st.lock();
        let res = st.check("fsync", &self.path);
        let i = &mut st.inodes[self.ino];
        if res.is_err() {
            // Linux: what was dirty is marked clean, unwritten.
            i.dropped.resize(i.data.len(), false);
            for (k, d) in i.dropped.iter_mut().enumerate() {
                *d |= i.synced.get(k) != i.data.get(k);
            }
            return res;
        }
        let old = std::mem::take(&mut i.synced);
        i.synced = i.data.clone();
        for (k, _) in i.dropped.iter().enumerate().filter(|(_, &d)| d) {
            // Never written after the failure: the disk keeps what it had.
            match (old.get(k), i.synced.get_mut(k)) {
                (Some(&o), Some(s)) => *s = o,
                (None, Some(s)) => *s = 0,
                _ => {}
            }
        }
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        let mut st = self.st.lock();
        st.check("truncate", &self.path)?;
        let i = &mut st.inodes[self.ino];
        i.data.resize(len as usize, 0);
        i.dropped.truncate(len as usize);
        Ok(())
    }
}

struct MemLock {
    st: Arc<Mutex<State>>,
    dir: PathBuf,
}

impl Drop for MemLock {
    fn drop(&mut self) {
        self.st.lock().locks.remove(&self.dir);
    }
}

impl Vfs for MemFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        for a in dir.ancestors() {
            st.dirs.entry(a.to_path_buf()).or_default();
        }
        Ok(())
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<DirLock> {
        let mut st = self.st.lock();
        st.dir(dir)?;
        st.check_read("lock", dir)?;
        if !st.locks.insert(dir.to_path_buf()) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the database is open in another handle or process",
            ));
        }
        Ok(Box::new(MemLock {
            st: Arc::clone(&self.st),
            dir: dir.to_path_buf(),
        }))
    }

    fn create_new(&self, path: &Path) -> io::Result<Box<dyn VFile>> {
        let mut st = self.st.lock();
        let (parent, name) = State::split(path)?;
        if st.dir(&parent)?.live.contains_key(&name) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        if st
            .fail_creates
            .as_ref()
            .is_some_and(|p| name.starts_with(p.as_str()))
        {
            st.note(format!("create {}", path.display()));
            return Err(Fault::NoSpace.error());
        }
        st.check("create", path)?;
        let ino = st.inodes.len();
        st.inodes.push(Inode::default());
        st.dir(&parent)?.live.insert(name, ino);
        Ok(Box::new(MemFile {
            st: Arc::clone(&self.st),
            ino,
            path: path.to_path_buf(),
        }))
    }

    fn open_write(&self, path: &Path) -> io::Result<Box<dyn VFile>> {
        let ino = {
            let mut st = self.st.lock();
            let ino = st.lookup(path)?;
            st.check_read("open", path)?;
            ino
        };
        Ok(Box::new(MemFile {
            st: Arc::clone(&self.st),
            ino,
            path: path.to_path_buf(),
        }))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut st = self.st.lock();
        let ino = st.lookup(path)?;
        st.check_read("read", path)?;
        Ok(st.inodes[ino].data.clone())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut st = self.st.lock();
        st.dir(dir)?;
        st.check_read("list", dir)?;
        Ok(st.dir(dir)?.live.keys().cloned().collect())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        let ino = st.lookup(from)?;
        let (fp, fname) = State::split(from)?;
        let (tp, tname) = State::split(to)?;
        st.dir(&tp)?;
        st.check("rename", from)?;
        st.dir(&fp)?.live.remove(&fname);
        st.dir(&tp)?.live.insert(tname, ino);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        st.lookup(path)?;
        st.check("remove", path)?;
        let (p, name) = State::split(path)?;
        st.dir(&p)?.live.remove(&name);
        Ok(())
    }

    fn canonical(&self, path: &Path) -> io::Result<PathBuf> {
        Ok(path.to_path_buf())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st.lock();
        st.dir(dir)?;
        st.check("fsync-dir", dir)?;
        let d = st.dir(dir)?;
        d.durable = d.live.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_loss_keeps_what_fsyncs_made_durable() {
        let fs = MemFs::new();
        let d = Path::new("/db");
        fs.create_dir_all(d).unwrap();
        let mut a = fs.create_new(&d.join("a")).unwrap();
        a.write_all(&[1; 100]).unwrap();
        a.sync().unwrap();
        fs.sync_dir(d).unwrap();
        a.write_all(&[2; 2000]).unwrap(); // unsynced: torn at a sector boundary
        let mut b = fs.create_new(&d.join("b")).unwrap(); // never made durable in /db
        b.write_all(b"x").unwrap();
        b.sync().unwrap();
        fs.rename(&d.join("a"), &d.join("c")).unwrap(); // not durable either
        for seed in 0..20 {
            let after = fs.power_loss_with(seed, Tear::Prefix);
            let files = after.files();
            assert_eq!(files.keys().collect::<Vec<_>>(), vec![&d.join("a")]);
            let a = &files[&d.join("a")];
            assert!(a.starts_with(&[1; 100]));
            assert!(
                [100, 512, 1024, 1536, 2048, 2100].contains(&a.len()),
                "{}",
                a.len()
            );
        }
    }

    /// `/db/a`: 4096 bytes allocated, its first 100 ones synced, then `n` bytes written in
    /// place after them, unsynced, over the zeros.
    fn in_place_over_zeros(n: usize) -> (MemFs, &'static Path) {
        let fs = MemFs::new();
        let d = Path::new("/db");
        fs.create_dir_all(d).unwrap();
        let mut a = fs.create_new(&d.join("a")).unwrap();
        a.allocate(4096).unwrap();
        a.write_at(0, &[1; 100]).unwrap();
        a.sync().unwrap();
        fs.sync_dir(d).unwrap();
        a.write_at(100, &vec![2; n]).unwrap();
        (fs, d)
    }

    #[test]
    fn power_loss_keeps_a_sector_prefix_of_writes_in_place() {
        let (fs, d) = in_place_over_zeros(1000);
        let mut seen = HashSet::new();
        for seed in 0..40 {
            let after = fs.power_loss_with(seed, Tear::Prefix);
            let a = &after.files()[&d.join("a")];
            assert_eq!(a.len(), 4096, "in-place writes keep the size");
            assert_eq!(&a[..100], &[1; 100]);
            let new = a[100..].iter().take_while(|&&b| b == 2).count();
            assert!(a[100 + new..].iter().all(|&b| b == 0), "seed {seed}");
            assert!([0, 412, 924, 1000].contains(&new), "{new}");
            seen.insert(new);
        }
        assert!(seen.len() > 2, "the cut varies: {seen:?}");
    }

    #[test]
    fn power_loss_may_keep_any_sectors_of_writes_in_place() {
        let (fs, d) = in_place_over_zeros(2000);
        let mut patterns = HashSet::new();
        for seed in 0..64 {
            let after = fs.power_loss_with(seed, Tear::Scattered);
            let a = &after.files()[&d.join("a")];
            assert_eq!(a.len(), 4096, "in-place writes keep the size");
            assert_eq!(&a[..100], &[1; 100]);
            // Sector by sector: all new or all old.
            let sectors: Vec<bool> = (0..8)
                .map(|s| {
                    let lo = (s * 512).max(100);
                    let hi = (s * 512 + 512).min(2100).max(lo);
                    let new = a[lo..hi].iter().all(|&b| b == 2);
                    let old = a[lo..hi].iter().all(|&b| b == 0);
                    assert!(new || old, "seed {seed}: sector {s} is mixed");
                    new && hi > lo
                })
                .collect();
            assert!(a[2100..].iter().all(|&b| b == 0));
            patterns.insert(sectors);
        }
        // Some pattern keeps a later sector without an earlier one.
        assert!(
            patterns.iter().any(|p| p.windows(2).any(|w| !w[0] && w[1])),
            "{patterns:?}"
        );
    }

    #[test]
    fn the_chosen_operation_fails_once_or_for_good() {
        let fs = MemFs::new();
        let d = Path::new("/db");
        fs.create_dir_all(d).unwrap();
        fs.fail_at(1, Fault::NoSpace, false);
        let mut a = fs.create_new(&d.join("a")).unwrap(); // op 0
        let e = a.write_all(&[7; 10]).unwrap_err(); // op 1
        assert_eq!(e.raw_os_error(), Some(28));
        assert_eq!(fs.injected().as_deref(), Some("write /db/a"));
        a.write_all(&[8; 2]).unwrap(); // op 2 succeeds
        assert_eq!(fs.files()[&d.join("a")], vec![7, 7, 7, 7, 7, 8, 8]);
        fs.fail_at(3, Fault::Eio, true);
        assert!(a.sync().is_err());
        assert!(fs.sync_dir(d).is_err());
        assert_eq!(fs.ops(), 5);
    }
}
