//! Doppel's coordinator (thesis §5.2): the thread that classifies records (§3.6) and changes
//! phases, reconciling the slices into the records at the end of each split phase; and the
//! handle through which it sees its database ([`Store`]).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::{
    epoch_of, key_hash, Delta, Doppel, DoppelOptions, DoppelStats, Key, OpClass, Phase, SplitMap,
    SplitOp, CHANGING, SPLIT,
};
use crate::error::{Error, Result};
use crate::lock::TableId;
use crate::log::record::Write as LogWrite;

/// Computes a record's reconciled value from its live value (`None`: leave the record).
pub(crate) type Fold<'a> = &'a mut dyn FnMut(Option<&[u8]>) -> Option<Vec<u8>>;

/// What the coordinator needs of its database, and nothing more: the live values of the
/// records it splits and reconciles, a way to fold slices into a record as a committed write
/// (the optimistic protocol's TID word is the database's business, see
/// `txn::occ::install_reconciled`), and the log. The database implements it; the coordinator
/// holds it weakly (see [`DoppelHandle`]).
pub(crate) trait Store: Send + Sync {
    /// The live value of `key` in table `table` (`None` inside: absent, or a ghost); `None`
    /// when there is no such table.
    fn live_value(&self, table: TableId, key: &[u8]) -> Option<Option<Vec<u8>>>;

    /// Replaces the record of `key` with `f(live value)`, with a new TID, unless `f` gives
    /// `None`; false when there is no such table.
    fn reconcile(&self, table: TableId, key: &[u8], f: Fold<'_>) -> bool;

    /// Whether the database has a log.
    fn logging(&self) -> bool;

    /// Logs `writes` (after-images) as one commit record of a new transaction id.
    fn log_commit(&self, writes: Vec<LogWrite>);

    /// The database's `Options::max_value_len`.
    fn max_value_len(&self) -> usize;
}

/// The records of `want` that can be split now: those whose table exists and whose live
/// value holds the operation's type (see [`SplitOp::fits`]).
fn splittable(db: &dyn Store, want: &FxHashMap<Key, SplitOp>) -> FxHashMap<Key, SplitOp> {
    let max = db.max_value_len();
    want.iter()
        .filter(|((t, k), op)| {
            db.live_value(*t, k)
                .is_some_and(|v| op.fits(v.as_deref(), max))
        })
        .map(|(key, op)| (key.clone(), *op))
        .collect()
}

impl Doppel {
    /// Evaluates the statistics gathered since the last call (§3.6).
    fn classify(&self) -> FxHashMap<Key, SplitOp> {
        let mut all: FxHashMap<Key, Vec<(OpClass, u64, u64)>> = FxHashMap::default();
        for s in self.slots.iter() {
            let stats = {
                let mut d = s.data.lock();
                let stats = std::mem::take(&mut d.stats);
                // Watch next interval what conflicted in this one, and the split records.
                let mut watch: rustc_hash::FxHashSet<(TableId, u64)> = stats
                    .iter()
                    .filter(|(_, v)| v.iter().any(|e| e.2 > 0))
                    .map(|((t, k), _)| (*t, key_hash(k)))
                    .collect();
                for (t, m) in d.split.iter() {
                    watch.extend(m.keys().map(|k| (*t, key_hash(k))));
                }
                d.watch = watch;
                stats
            };
            for (k, v) in stats {
                let e = all.entry(k).or_default();
                for (class, n, c) in v {
                    match e.iter_mut().find(|x| x.0 == class) {
                        Some(x) => {
                            x.1 += n;
                            x.2 += c;
                        }
                        None => e.push((class, n, c)),
                    }
                }
            }
        }
        let ctl = self.ctl.lock();
        let mut out = ctl.hints.clone();
        if !self.opts.auto_classify {
            return out;
        }
        let o = &self.opts;
        let mut any = !ctl.current.is_empty() || !out.is_empty();
        // Most conflicted first, so the higher first-split threshold applies to the best.
        let mut scored: Vec<(Key, SplitOp, f64, u64)> = all
            .into_iter()
            .filter_map(|(k, v)| {
                let n: u64 = v.iter().map(|e| e.1).sum();
                v.iter()
                    .filter_map(|&(class, n_op, c_op)| match class {
                        OpClass::Split(op) => {
                            let savings =
                                o.conflict_weight * c_op as f64 + o.issue_weight * n_op as f64;
                            let impact = savings / (n.saturating_sub(n_op).max(1)) as f64;
                            Some((op, impact, c_op))
                        }
                        _ => None,
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map(|(op, impact, c)| (k, op, impact, c))
            })
            .collect();
        scored.sort_by_key(|e| std::cmp::Reverse(e.3));
        for (k, op, impact, c) in scored {
            if out.contains_key(&k) {
                continue;
            }
            if ctl.current.get(&k) == Some(&op) {
                if impact >= o.join_threshold {
                    out.insert(k, op);
                }
            } else {
                let t = if any {
                    o.split_threshold_after_first
                } else {
                    o.split_threshold
                };
                if c >= o.min_conflicts && impact > t {
                    out.insert(k, op);
                    any = true;
                }
            }
        }
        out
    }

    /// Changes phase: to split with `target`, or to joined (`None`). False when cancelled.
    fn change(&self, db: &dyn Store, target: Option<&FxHashMap<Key, SplitOp>>) -> bool {
        let w = self.word.load(Ordering::SeqCst);
        self.word.store(w | CHANGING, Ordering::SeqCst);
        let start = Instant::now();
        let mut spins = 0u32;
        while self
            .slots
            .iter()
            .any(|s| s.active.load(Ordering::SeqCst) != 0)
        {
            // A database that is closing cancels: its coordinator is about to be joined.
            if start.elapsed() > self.opts.drain_timeout || self.stop.load(Ordering::Acquire) {
                self.word.store(w, Ordering::SeqCst);
                self.cancelled.fetch_add(1, Ordering::Relaxed);
                self.wake();
                return false;
            }
            spins += 1;
            if spins < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        if w & SPLIT != 0 {
            self.reconcile(db);
        }
        let mut ctl = self.ctl.lock();
        let mut map: SplitMap = FxHashMap::default();
        ctl.current.clear();
        if let Some(target) = target {
            for ((t, k), op) in splittable(db, target) {
                map.entry(t).or_default().insert(k.clone(), op);
                ctl.current.insert((t, k), op);
            }
        }
        let n = ctl.current.len();
        drop(ctl);
        for s in self.slots.iter() {
            s.data.lock().split = Arc::new(map.clone());
        }
        let split = target.is_some() && n > 0;
        if split {
            self.split_phases.fetch_add(1, Ordering::Relaxed);
            self.max_split.fetch_max(n as u64, Ordering::Relaxed);
        }
        self.stashes.store(0, Ordering::SeqCst);
        self.first_stash.store(0, Ordering::SeqCst);
        let next = ((epoch_of(w) + 1) << 2) | if split { SPLIT } else { 0 };
        self.word.store(next, Ordering::SeqCst);
        self.wake();
        true
    }

    /// OP_reconcile for every slice of every worker, while no transaction runs; logs the
    /// reconciled values.
    fn reconcile(&self, db: &dyn Store) {
        // Every worker's summaries of a key are merged first and applied once: an ADD
        // saturates only at the end, as one that clamped per worker would lose additions
        // whose total fits.
        let mut all: FxHashMap<Key, Delta> = FxHashMap::default();
        for s in self.slots.iter() {
            let slices = std::mem::take(&mut s.data.lock().slices);
            for (key, d) in slices {
                match all.entry(key) {
                    std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().merge(d),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(d);
                    }
                }
            }
        }
        let mut touched: rustc_hash::FxHashSet<Key> = rustc_hash::FxHashSet::default();
        for ((t, k), d) in all {
            // `fits` was checked when the record was split and nothing else wrote it since,
            // so this cannot fail; keep the old value if it does anyway.
            if db.reconcile(t, &k, &mut |cur| d.apply(&k, cur, true).ok()) {
                touched.insert((t, k));
            }
        }
        if db.logging() && !touched.is_empty() {
            let writes = touched
                .iter()
                .map(|(t, k)| LogWrite {
                    table: *t,
                    key: k.to_vec(),
                    value: db.live_value(*t, k).flatten(),
                })
                .collect();
            db.log_commit(writes);
        }
    }

    fn stats(&self) -> DoppelStats {
        let w = self.word.load(Ordering::SeqCst);
        DoppelStats {
            phase: Some(if w & SPLIT != 0 {
                Phase::Split
            } else {
                Phase::Joined
            }),
            epoch: epoch_of(w),
            split_phases: self.split_phases.load(Ordering::Relaxed),
            stashed: self.total_stashed.load(Ordering::Relaxed),
            split_keys: self.ctl.lock().current.len(),
            max_split_keys: self.max_split.load(Ordering::Relaxed) as usize,
            cancelled_changes: self.cancelled.load(Ordering::Relaxed),
        }
    }

    /// The coordinator loop (§5.2).
    fn coordinate(self: Arc<Self>, db: Weak<dyn Store>) {
        let o = self.opts.clone();
        let tick = (o.split_phase / 10).clamp(Duration::from_micros(100), Duration::from_millis(1));
        let mut last_classify = Instant::now();
        let mut joined_since = Instant::now();
        let mut split_since = Instant::now();
        // After a cancelled change the next try waits: the drain timeout, doubling per cancel
        // up to eight of them (at most `MAX_BACKOFF`). Retried at the next tick, one long
        // transaction kept `CHANGING` set, and with it every other `begin()` waiting, 96% of
        // the time (a drain timeout per try). The cap keeps a joined phase that stashed work
        // waits for within a few tries once the long transaction ends.
        let mut retry = Retry {
            wait: Duration::ZERO,
            at: Instant::now(),
            min: o.drain_timeout,
        };
        loop {
            // Parked rather than asleep: `DoppelHandle::shutdown` unparks it to stop at once.
            std::thread::park_timeout(tick);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            // The database is upgraded only for a phase change, so a dropped database is not
            // kept alive (and its directory locked) by this thread in between.
            if db.strong_count() == 0 {
                return;
            }
            let reclassify = std::mem::take(&mut self.ctl.lock().reclassify);
            if reclassify || last_classify.elapsed() >= o.classify_interval {
                let d = self.classify();
                self.ctl.lock().desired = d;
                last_classify = Instant::now();
            }
            let (desired, current) = {
                let c = self.ctl.lock();
                (c.desired.clone(), c.current.clone())
            };
            if Instant::now() < retry.at {
                continue;
            }
            let w = self.word.load(Ordering::SeqCst);
            if w & SPLIT == 0 {
                if self.pending.load(Ordering::Acquire) > 0 && joined_since.elapsed() < o.max_joined
                {
                    continue;
                }
                if !desired.is_empty() {
                    let Some(inner) = db.upgrade() else { return };
                    // A record whose value cannot take its operation is not split: with no
                    // other, a change would drain the running transactions and block new
                    // ones for a split phase of nothing, at every tick.
                    let want = splittable(&*inner, &desired);
                    if !want.is_empty() && retry.after(self.change(&*inner, Some(&want))) {
                        split_since = Instant::now();
                    }
                }
            } else {
                let n = self.stashes.load(Ordering::Acquire);
                let first = self.first_stash.load(Ordering::Acquire);
                // Stashed threads whose joined phase was cut short (`max_joined`) still wait:
                // they count as stashed at the start of this phase.
                let waiting = self.pending.load(Ordering::Acquire) > 0
                    && split_since.elapsed() >= o.split_phase;
                let due = n >= o.stash_threshold
                    || waiting
                    || (first != 0
                        && self.now_ns().saturating_sub(first) >= o.split_phase.as_nanos() as u64);
                // The split set is out of date when the wanted records that can be split
                // differ from it (not every wanted one: one that cannot be split would end
                // every split phase at once).
                let stale = desired != current && {
                    let Some(inner) = db.upgrade() else { return };
                    splittable(&*inner, &desired) != current
                };
                if due || stale {
                    let Some(inner) = db.upgrade() else { return };
                    if retry.after(self.change(&*inner, None)) {
                        joined_since = Instant::now();
                    }
                }
            }
        }
    }
}

/// Longest wait before the coordinator retries a phase change that was cancelled.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// When the coordinator may try a phase change again.
struct Retry {
    wait: Duration,
    at: Instant,
    /// The first wait after a cancel (the drain timeout).
    min: Duration,
}

impl Retry {
    /// Notes whether a change went through (`ok`, passed on): a cancelled one doubles the
    /// wait before the next, one that went through clears it.
    fn after(&mut self, ok: bool) -> bool {
        if ok {
            self.wait = Duration::ZERO;
        } else {
            let most = (self.min * 8).min(MAX_BACKOFF).max(self.min);
            self.wait = (self.wait * 2).clamp(self.min, most);
            self.at = Instant::now() + self.wait;
        }
        ok
    }
}

/// The handle the database keeps: the runtime plus its coordinator thread.
///
/// The coordinator holds the database only weakly, and strongly only during a phase change;
/// [`shutdown`](Self::shutdown) (called when the last user handle of the database is dropped)
/// stops and joins it, so the database is never dropped on the coordinator's thread.
pub(crate) struct DoppelHandle {
    pub(crate) rt: Arc<Doppel>,
    coordinator: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for DoppelHandle {
    fn drop(&mut self) {
        self.rt.stop.store(true, Ordering::Release);
    }
}

impl DoppelHandle {
    pub(crate) fn new(db: u64, opts: DoppelOptions) -> DoppelHandle {
        DoppelHandle {
            rt: Doppel::new(db, opts),
            coordinator: Mutex::new(None),
        }
    }

    /// Starts the coordinator thread.
    pub(crate) fn spawn(&self, db: Weak<dyn Store>) -> Result<()> {
        let rt = Arc::clone(&self.rt);
        let h = std::thread::Builder::new()
            .name("shoal-doppel".into())
            .spawn(move || rt.coordinate(db))
            .map_err(|source| Error::Io {
                path: "<doppel coordinator thread>".into(),
                source,
            })?;
        *self.coordinator.lock() = Some(h);
        Ok(())
    }

    /// Stops the coordinator and waits until its thread has exited (at most one phase change:
    /// no transaction runs once the database's last handle is gone, so a change in progress
    /// drains at once, or is cancelled). A call from the coordinator's own thread only stops
    /// it.
    pub(crate) fn shutdown(&self) {
        self.rt.stop.store(true, Ordering::Release);
        let Some(h) = self.coordinator.lock().take() else {
            return;
        };
        h.thread().unpark();
        if h.thread().id() != std::thread::current().id() {
            // A panic of the coordinator has been reported on its thread already.
            let _ = h.join();
        }
    }

    pub(crate) fn hint(&self, key: Key, op: Option<SplitOp>) {
        let mut c = self.rt.ctl.lock();
        match op {
            Some(op) => {
                c.hints.insert(key, op);
            }
            None => {
                c.hints.remove(&key);
            }
        }
        c.reclassify = true;
    }

    pub(crate) fn stats(&self) -> DoppelStats {
        self.rt.stats()
    }

    pub(crate) fn split_keys(&self) -> Vec<(TableId, Vec<u8>, SplitOp)> {
        let mut v: Vec<_> = self
            .rt
            .ctl
            .lock()
            .current
            .iter()
            .map(|((t, k), op)| (*t, k.to_vec(), *op))
            .collect();
        v.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        v
    }
}
